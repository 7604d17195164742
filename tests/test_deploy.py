"""The deployment files: the Helm chart (deploy/helm/compaction-proxy), the compose file
(deploy/compose.yaml with deploy/nginx.conf) and the Dockerfile with its lock.

Checked statically always: the files parse, values.yaml passes the chart's values.schema.json
(and bad values do not), templates use only values that exist, compose runs two or more replicas on
one Redis behind nginx with health checks, the Dockerfile installs from the lock with hashes and
checks health with the serving process's own config. With the Helm CLI (scripts/install-helm; $HELM
or PATH; skipped without it, failed under CI) the chart is rendered with `helm template` in several
shapes, each manifest validated against Kubernetes' own schemas (kubernetes-validate, strict), and
the config it renders loaded by the proxy's own config loader. There is no Docker engine here: the
images are not built or run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from proxy.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "compaction-proxy"
KUBERNETES = "1.35.0"  # the Kubernetes version manifests are validated against


def values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


# ---- the chart, statically ----------------------------------------------------------------------


def test_values_pass_the_charts_schema_and_bad_values_do_not():
    jsonschema.validate(values(), schema())
    for path, bad in [(("replicaCount",), "two"), (("replicaCount",), 0), (("autoscaling", "enabled"), "yes"),
                      (("redis", "url"), "http://r:6379"), (("image", "digest"), "latest"),
                      (("service", "type"), "Ingress"), (("secrets", "upstreamKey"), "sk-x")]:
        v = values()
        node = v
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(v, schema())


def test_the_charts_schema_takes_a_redis_cluster_url():
    v = values()
    v["redis"]["url"] = "redis+cluster://r1:6379,r2:6379/"
    jsonschema.validate(v, schema())


def test_hpa_is_off_by_default_and_redis_on():
    v = values()
    assert v["autoscaling"]["enabled"] is False and v["replicaCount"] >= 2 and v["redis"]["enabled"] is True


def _value_paths(node: Any, prefix: str = "") -> set[str]:
    out = {prefix} if prefix else set()
    if isinstance(node, dict):
        for k, v in node.items():
            out |= _value_paths(v, f"{prefix}.{k}" if prefix else k)
    return out


def test_templates_use_only_values_that_exist():
    defined = _value_paths(values())
    used: set[str] = set()
    for tpl in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", tpl.read_text()))
    assert used, "no .Values reference found"
    assert used <= defined, sorted(used - defined)
    # and every top-level value is used somewhere (none left over from an old template)
    assert {p for p in defined if "." not in p} <= {u.split(".")[0] for u in used}


def test_chart_files_parse():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "compaction-proxy"
    assert {"deployment.yaml", "service.yaml", "configmap.yaml", "secret.yaml", "hpa.yaml", "redis.yaml"} <= \
        {p.name for p in (CHART / "templates").iterdir()}


# ---- the chart, rendered --------------------------------------------------------------------------


def helm_binary() -> str:
    found = os.environ.get("HELM") or shutil.which("helm")
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compaction-proxy-ci" / "helm" / "helm"
    if not found and default.exists():
        found = str(default)
    if not found:
        reason = "helm not installed (scripts/install-helm; or set HELM)"
        if os.environ.get("CI"):
            pytest.fail(reason + " -- CI is set, so this is an error", pytrace=False)
        pytest.skip(reason)
    return found


def render(*sets: str) -> list[dict[str, Any]]:
    args = [helm_binary(), "template", "rel", str(CHART)] + [a for s in sets for a in ("--set", s)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def render_error(*sets: str) -> str:
    args = [helm_binary(), "template", "rel", str(CHART)] + [a for s in sets for a in ("--set", s)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0, run.stdout[:2000]
    return run.stderr


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


SHAPES = {
    "defaults": (),
    "hpa": ("autoscaling.enabled=true",),
    "own-redis": ("redis.url=redis://redis.example:6379/2",),
    "redis-persistent": ("redis.persistence.enabled=true", "image.digest=sha256:" + "a" * 64),
    "one-replica-sqlite": ("replicaCount=1", "redis.enabled=false", "secrets.existingSecret=keys"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_rendered_manifests_pass_kubernetes_schemas(shape, tmp_path):
    import kubernetes_validate

    docs = render(*SHAPES[shape])
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on any invalid field
    kinds = by_kind(docs)
    proxy = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "rel-compaction-proxy")
    pod = proxy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and ("HorizontalPodAutoscaler" in kinds) == (shape == "hpa")
    assert ("replicas" in proxy["spec"]) == (shape != "hpa")  # the HPA owns the count when on
    # the config the proxy reads is one its own loader accepts, with the store every replica shares
    config_map = next(d for d in kinds["ConfigMap"] if d["metadata"]["name"] == "rel-compaction-proxy")
    cfg = load_config(_written(tmp_path, config_map["data"]["proxy.yaml"]), environ={})
    expected_store = {"defaults": "redis://rel-compaction-proxy-redis:6379/0", "hpa": "redis://rel-compaction-proxy-redis:6379/0",
                      "own-redis": "redis://redis.example:6379/2", "redis-persistent": "redis://rel-compaction-proxy-redis:6379/0",
                      "one-replica-sqlite": "sqlite:///compaction-proxy.db"}[shape]
    assert cfg.store.url == expected_store and cfg.server.port == container["ports"][0]["containerPort"]
    assert ("Secret" in kinds) == (shape != "one-replica-sqlite")  # an existing secret is not made again
    assert container["envFrom"][0]["secretRef"]["name"] == ("keys" if shape == "one-replica-sqlite" else "rel-compaction-proxy")
    redis_deployed = any(d["metadata"]["name"] == "rel-compaction-proxy-redis" for d in kinds["Deployment"])
    assert redis_deployed == (shape in ("defaults", "hpa", "redis-persistent"))
    assert ("PersistentVolumeClaim" in kinds) == (shape == "redis-persistent")


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return path


def test_the_user_config_and_keys_go_where_the_proxy_reads_them(tmp_path):
    docs = by_kind(render("config.upstream.base_url=http://vllm:8000/v1", "config.models.my-llama.context_window=32768",
                          "secrets.upstreamApiKey=sk-upstream"))
    cfg = load_config(_written(tmp_path, docs["ConfigMap"][0]["data"]["proxy.yaml"]), environ={})
    assert cfg.upstream.base_url == "http://vllm:8000/v1" and cfg.context_window("my-llama") == 32768
    assert docs["Secret"][0]["stringData"]["COMPACTION_PROXY_UPSTREAM__API_KEY"] == "sk-upstream"
    assert "sk-upstream" not in docs["ConfigMap"][0]["data"]["proxy.yaml"]


def test_helm_refuses_what_would_not_work():
    assert "more than one replica needs a shared store" in render_error("redis.enabled=false")
    assert "replicaCount" in render_error("replicaCount=two")  # the schema, enforced by helm itself
    lint = subprocess.run([helm_binary(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr


# ---- compose and nginx ---------------------------------------------------------------------------


def test_compose_runs_replicas_on_one_redis_behind_nginx():
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "proxy", "nginx"}
    proxy = services["proxy"]
    replicas = proxy["deploy"]["replicas"]
    assert int(re.sub(r"\$\{PROXY_REPLICAS:-(\d+)\}", r"\1", str(replicas))) >= 2
    assert proxy["environment"]["COMPACTION_PROXY_STORE__URL"] == "redis://redis:6379/0"
    assert all("healthcheck" in s for s in services.values())
    assert proxy["healthcheck"]["test"] == ["CMD", "compaction-proxy", "health", "--pid", "1"]
    assert proxy["depends_on"]["redis"]["condition"] == services["nginx"]["depends_on"]["proxy"]["condition"] == \
        "service_healthy"
    assert (ROOT / "deploy" / proxy["build"]["context"] / proxy["build"]["dockerfile"]).resolve() == ROOT / "Dockerfile"
    mount = services["nginx"]["volumes"][0].split(":")
    conf = (ROOT / "deploy" / mount[0]).read_text()
    port = services["nginx"]["ports"][0].split(":")[-1]
    assert re.search(rf"listen {port};", conf) and "server proxy:8787 resolve;" in conf
    assert "proxy_buffering off;" in conf and "$http_upgrade" in conf  # streams and WebSockets
    # every variable the proxy is given is a config key of its own
    env = {k: "x" for k in proxy["environment"] if k != "COMPACTION_PROXY_STORE__URL"}
    env.update(COMPACTION_PROXY_STORE__URL="redis://redis:6379/0", COMPACTION_PROXY_UPSTREAM__BASE_URL="http://u/v1",
               COMPACTION_PROXY_ANTHROPIC__BASE_URL="http://a", COMPACTION_PROXY_SERVER__LOG_FORMAT="json")
    load_config(environ=env)


# ---- the Dockerfile and its lock -----------------------------------------------------------------


def _locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of deploy/requirements.lock."""
    text = (ROOT / "deploy" / "requirements.lock").read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        spec = line.split("--hash=")[0].split(";")[0].strip()
        name, version = spec.split("==")
        out[canonicalize_name(name)] = (version, re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


def test_the_lock_pins_every_dependency_with_hashes():
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+, as the image's)

    locked = _locked()
    assert all(hashes for _, hashes in locked.values()), [n for n, (_, h) in locked.items() if not h]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needs = [Requirement(r) for r in project["project"]["dependencies"]]
    needs += [Requirement(r) for r in project["build-system"]["requires"]]  # built with --no-build-isolation
    for req in needs:
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in deploy/requirements.lock (make it again: docs/operations.md)"
        assert req.specifier.contains(locked[name][0], prereleases=True), (str(req), locked[name][0])


def test_the_dockerfile_installs_from_the_lock_and_checks_its_own_port():
    text = (ROOT / "Dockerfile").read_text()
    lock_python = re.search(r"autogenerated by pip-compile with Python (\d+\.\d+)",
                            (ROOT / "deploy" / "requirements.lock").read_text()).group(1)
    base = re.search(r"^FROM python:(\d+\.\d+)-slim(@sha256:[0-9a-f]{64})?\s*$", text, re.M)
    assert base and base.group(1) == lock_python  # the lock was made for the base image's Python
    runs = re.findall(r"^RUN (.*)$", text, re.M)
    pip_runs = [r for r in runs if "pip install" in r]
    assert pip_runs[0] == "pip install --require-hashes --no-deps -r /build/requirements.lock"
    assert all("--no-deps" in r for r in pip_runs) and "--no-build-isolation" in pip_runs[1]  # nothing unpinned
    assert "COPY deploy/requirements.lock /build/requirements.lock" in text
    assert re.search(r'HEALTHCHECK .*\\\n\s+CMD \["compaction-proxy", "health", "--pid", "1"\]', text)
    assert "COMPACTION_PROXY_SERVER__PORT" not in text  # the port comes from the process's own config
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".e2e" in ignored

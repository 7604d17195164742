"""docs/configuration.md names every key of the typed config model with its environment variable:
a key added to proxy/config.py without a line there fails here."""

from pathlib import Path

from pydantic import BaseModel

from proxy.config import Config

DOC = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")


def _leaves(cls: type[BaseModel], prefix: tuple[str, ...] = ()):
    for name, field in cls.model_fields.items():
        key = prefix + (name,)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaves(ann, key)
        else:
            yield key


def test_every_key_is_documented_with_its_variable():
    keys = list(_leaves(Config))
    assert len(keys) > 50  # the walk reached the nested sections
    missing = [".".join(k) for k in keys if f"`{'.'.join(k)}`" not in DOC]
    assert not missing, f"keys missing from docs/configuration.md: {missing}"
    dict_valued = {("models",), ("billing", "prices")}  # keyed by model name: no single variable
    variables = ["COMPACTION_PROXY_" + "__".join(p.upper() for p in k) for k in keys if k not in dict_valued]
    missing_vars = [v for v in variables if f"`{v}`" not in DOC]
    assert not missing_vars, f"variables missing from docs/configuration.md: {missing_vars}"

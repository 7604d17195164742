// The compaction-proxy dashboard: reads /admin/api/dashboard every few seconds and draws it.
// Everything shown that came from a request (summaries, model names) goes in as text, never HTML.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const refreshS = Math.max(1, Number(params.get("refresh")) || 5);
  const TIERS = ["summarized", "masked", "degraded", "failed-open"];
  const COLORS = {
    received: "#1f77b4", forwarded: "#2ca02c", direct: "#d62728", proxy: "#2ca02c",
    summarized: "#9467bd", masked: "#17becf", degraded: "#ff7f0e", "failed-open": "#d62728",
    latency: "#8c564b", errors: "#d62728", failures: "#ff7f0e", cache: "#1f77b4",
  };
  const plots = {};
  const state = { feed: null, updates: 0, error: null };
  window.dashboard = { plots, state, COLORS };

  const $ = (id) => document.getElementById(id);
  const int = (v) => Math.round(v).toLocaleString("en-US");
  const dollars = (v) => "$" + v.toFixed(4);

  function deltas(a) {
    return a.map((v, i) => (i === 0 ? 0 : v - a[i - 1]));
  }
  function ratio(num, den, scale) {
    const dn = deltas(num), dd = deltas(den);
    return dn.map((v, i) => (dd[i] > 0 ? (scale * v) / dd[i] : null));
  }

  // Points mark the samples while there are few of them (a single sample is a point, not a line).
  function fewPoints(u, seriesIdx, idx0, idx1) {
    return idx1 - idx0 < 12;
  }

  // The left axis as wide as its longest label (a fixed width clipped "1,250,000"), measured in
  // the axis's own font; uPlot calls it again once the labels of new data are known.
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap;
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    if (longest !== "") {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / devicePixelRatio;
    }
    return Math.ceil(size) + 4;
  }

  function plot(id, series, data) {
    const el = $(id);
    const width = Math.max(300, el.clientWidth || 400);
    if (!plots[id]) {
      plots[id] = new uPlot({
        width, height: 180,
        legend: { show: true, live: false },
        scales: { x: { time: true } },
        series: [{}].concat(series.map((s) => ({ label: s.label, stroke: s.color, width: 2, spanGaps: true, points: { show: fewPoints, size: 7, fill: s.color } }))),
        axes: [{ space: 70, values: (u, ticks) => ticks.map((v) => new Date(v * 1000).toLocaleTimeString("en-GB")) }, { size: axisSize }],
      }, data, el);
    } else {
      plots[id].setData(data);
    }
  }

  function draw(feed) {
    const s = feed.series;
    const t = s.t || [];
    if (t.length === 0) return;
    plot("plot-tokens", [{ label: "received", color: COLORS.received }, { label: "forwarded", color: COLORS.forwarded }],
      [t, deltas(s.tokens_received), deltas(s.tokens_forwarded)]);
    plot("plot-cost", [{ label: "sent directly", color: COLORS.direct }, { label: "through the proxy", color: COLORS.proxy }],
      [t, s.cost_direct, s.cost_proxy]);
    plot("plot-tiers", TIERS.map((k) => ({ label: k, color: COLORS[k] })),
      [t].concat(TIERS.map((k) => deltas(s["compactions_" + k] || t.map(() => 0)))));
    plot("plot-latency", [{ label: "mean s per call", color: COLORS.latency }],
      [t, ratio(s.summarizer_seconds, s.summarizer_calls, 1)]);
    plot("plot-errors", [{ label: "5xx answers", color: COLORS.errors }, { label: "summarizer failures", color: COLORS.failures },
      { label: "store errors", color: "#7f7f7f" }],
      [t, deltas(s.errors), deltas(s.summarizer_failures), deltas(s.store_errors)]);
    plot("plot-cache", [{ label: "% cached", color: COLORS.cache }], [t, ratio(s.upstream_cached, s.upstream_prompt, 100)]);
  }

  function figures(f) {
    for (const k of ["requests", "tokens_received", "tokens_forwarded", "tool_notes", "summarizer_calls",
      "summarizer_failures", "errors", "prefix_breaks", "observed_tokens_saved"]) {
      $("fig-" + k).textContent = int(f[k]);
    }
    $("fig-tokens_saved").textContent = int(f.tokens_received - f.tokens_forwarded);
    for (const tier of TIERS) $("fig-compactions-" + tier).textContent = int(f.compactions[tier] || 0);
    $("fig-store").textContent = f.store_up ? "up" : "DOWN";
    $("fig-cached_share").textContent = f.upstream_prompt > 0 ? ((100 * f.upstream_cached) / f.upstream_prompt).toFixed(1) + "%" : "-";
    $("fig-cost_direct").textContent = dollars(f.cost_direct);
    $("fig-cost_proxy").textContent = dollars(f.cost_proxy);
    $("fig-cost_saved").textContent = dollars(f.cost_direct - f.cost_proxy);
    $("fig-observed_cost_saved").textContent = dollars(f.observed_cost_saved);
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function events(list) {
    const ol = $("events");
    ol.replaceChildren();
    if (!list.length) ol.append(el("li", "muted", "none yet"));
    list.forEach((e, i) => {
      const li = el("li", "event tier-" + e.tier);
      const when = new Date(e.time * 1000).toLocaleString();
      li.append(el("div", "event-head",
        `${when} · ${e.tier}${e.observed ? " (observed)" : ""}${e.why ? " · " + e.why : ""} · ${e.model} · ${e.tokens_before} → ${e.tokens_after} tokens · ` +
        `${e.covered} of ${e.messages} messages summarized · ${e.calls} summarizer calls · waited ${Math.round(e.wait_ms)} ms`));
      for (const c of e.cut || []) li.append(el("div", "event-cut", "cut: " + c));
      if (e.reason) li.append(el("div", "event-reason", "reason: " + e.reason));
      if (e.summary) {
        const d = el("details", "event-summary");
        if (i === 0) d.open = true;
        d.append(el("summary", null, "summary"));
        d.append(el("pre", "summary-text", e.summary));
        li.append(d);
      }
      ol.append(li);
    });
  }

  function bill(b, date) {
    $("prices-date").textContent = "(prices of " + date + "; direct = estimated, with the provider's prompt cache)";
    const body = $("bill").querySelector("tbody");
    body.replaceChildren();
    if (!b) return;
    for (const c of b.conversations) {
      const tr = el("tr");
      for (const v of [c.conversation, c.model, c.requests, c.summarizer_calls, c.direct.toFixed(4), c.proxy.toFixed(4), c.saved.toFixed(4)]) {
        tr.append(el("td", null, String(v)));
      }
      body.append(tr);
    }
  }

  async function refresh() {
    try {
      const r = await fetch("/admin/api/dashboard", { headers: token ? { Authorization: "Bearer " + token } : {}, cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const feed = await r.json();
      state.feed = feed;
      figures(feed.figures);
      draw(feed);
      events(feed.events);
      bill(feed.bill, feed.prices_date);
      state.updates += 1;
      state.error = null;
      $("status").textContent = (feed.metrics_enabled ? "" : "metrics are off (metrics.enabled) · ") +
        "updated " + new Date(feed.now * 1000).toLocaleTimeString() + ", every " + refreshS + " s";
    } catch (err) {
      state.error = String(err);
      $("status").textContent = "cannot read the feed: " + err;
    }
  }

  refresh();
  setInterval(refresh, refreshS * 1000);
})();

"""PNG charts of a benchmark result: throughput and TTFT against concurrency, and the
distribution of end-to-end latency at each level. matplotlib runs headless (Agg)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def plot_result(result: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and never a Qt window from the engine
    import matplotlib.pyplot as plt

    levels = result.get("levels") or []
    if not levels:
        raise ValueError("the result has no measured levels to plot")
    conc = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), constrained_layout=True)
    target = result.get("target", {})
    title = (f"{target.get('name') or target.get('model_id') or target.get('url', '')} - "
             f"{target.get('runtime') or target.get('url', '')} - "
             f"workload {result.get('workload', {}).get('name', '?')}")
    fig.suptitle(title, fontsize=10)

    ax = axes[0]
    ax.plot(conc, [lv["total_throughput_tps"] for lv in levels], "o-", label="total")
    ax.plot(conc, [lv["gen_tps_p50"] or 0 for lv in levels], "s--", label="per request (p50)")
    rf = result.get("roofline")
    if rf and rf.get("limit_tps"):
        ax.axhline(rf["limit_tps"], color="grey", linestyle=":",
                   label=f"single-stream roofline {rf['limit_tps']:.0f} t/s")
    ax.set(title="Generation throughput", xlabel="concurrent requests", ylabel="tokens/s")
    ax.set_xticks(conc)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    ax = axes[1]
    ax.plot(conc, [lv["ttft_p50"] or 0 for lv in levels], "o-", label="p50")
    ax.plot(conc, [lv["ttft_p95"] or 0 for lv in levels], "s--", label="p95")
    slo = result.get("config", {}).get("slo_ttft_s")
    if slo:
        ax.axhline(slo, color="red", linestyle=":", label=f"objective {slo:g} s")
    ax.set(title="Time to first token", xlabel="concurrent requests", ylabel="seconds")
    ax.set_xticks(conc)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    ax = axes[2]
    traces = result.get("traces") or {}
    data = [[t["latency"] for t in traces.get(str(c), []) if t.get("error") is None
             and not t.get("timed_out")] for c in conc]
    if any(data):
        ax.boxplot([d or [0.0] for d in data], tick_labels=[str(c) for c in conc])
    ax.set(title="End-to-end latency", xlabel="concurrent requests", ylabel="seconds")
    ax.set_ylim(bottom=0)

    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)

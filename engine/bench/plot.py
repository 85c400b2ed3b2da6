"""PNG charts of a benchmark result: throughput and TTFT against concurrency, and the
distribution of end-to-end latency at each level. matplotlib runs headless (Agg)."""

from __future__ import annotations

import os

from engine.bench.result import BenchResult


def plot_result(result: BenchResult, path: str | os.PathLike[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and never a Qt window from the engine
    import matplotlib.pyplot as plt

    levels = result.levels
    if not levels:
        raise ValueError("the result has no measured levels to plot")
    conc = [lv.concurrency for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), constrained_layout=True)
    target = result.target
    title = (
        f"{target.get('name') or target.get('model_id') or target.get('url', '')} - "
        f"{target.get('runtime') or target.get('url', '')} - "
        f"workload {result.workload.name or '?'}"
    )
    fig.suptitle(title, fontsize=10)

    ax = axes[0]
    ax.plot(conc, [lv.total_throughput_tps for lv in levels], "o-", label="total")
    ax.plot(conc, [lv.gen_tps_p50 or 0 for lv in levels], "s--", label="per request (p50)")
    rf = result.roofline
    if rf is not None and rf.limit_tps:
        ax.axhline(
            rf.limit_tps,
            color="grey",
            linestyle=":",
            label=f"single-stream roofline {rf.limit_tps:.0f} t/s",
        )
    ax.set(title="Generation throughput", xlabel="concurrent requests", ylabel="tokens/s")
    ax.set_xticks(conc)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    ax = axes[1]
    ax.plot(conc, [lv.ttft_p50 or 0 for lv in levels], "o-", label="p50")
    ax.plot(conc, [lv.ttft_p95 or 0 for lv in levels], "s--", label="p95")
    slo = result.config.slo_ttft_s
    if slo:
        ax.axhline(slo, color="red", linestyle=":", label=f"objective {slo:g} s")
    ax.set(title="Time to first token", xlabel="concurrent requests", ylabel="seconds")
    ax.set_xticks(conc)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    ax = axes[2]
    data = [
        [t.latency for t in result.traces.get(c, []) if t.error is None and not t.timed_out]
        for c in conc
    ]
    if any(data):
        ax.boxplot([d or [0.0] for d in data], tick_labels=[str(c) for c in conc])
    ax.set(title="End-to-end latency", xlabel="concurrent requests", ylabel="seconds")
    ax.set_ylim(bottom=0)

    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)

"""Draws the benchmark's chart from its JSON report.

    python3 bench/chart.py bench/results/<date>-<host>.json bench/results/<date>-<host>.png

Bars are medians, whiskers reach the p95; a red dashed (p50) or dotted (p95)
mark across a bar is that figure's target (from issues 3 and 4). The last panel is the density run.
The benchmark runs this with the kernel venv's python, which has matplotlib.
"""

import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("recipe", "The recipe's path: create → context → plot with PNG (ms)"),
    ("create", "Create → first result, sequential (ms)"),
    ("burst", "Create → first result, concurrent burst (ms)"),
    ("roundtrip", "Round trips (ms)"),
    ("ratio", "API vs baseline (×)"),
    ("fork", "Fork (ms)"),
    ("snapshot", "Snapshot and restore (ms)"),
    ("size", "Snapshot image (MB)"),
    ("memory", "Idle memory per sandbox (MiB PSS)"),
    ("throughput", "File transfer (MB/s)"),
    ("network", "HTTP from a sandbox vs the host (MB/s)"),
]


def fmt(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def bars(ax, stats, title):
    """Horizontal bars, first figure on top, so long names stay readable."""
    names = ["\n".join(textwrap.wrap(s["name"].strip(), 34)) for s in stats]
    med = [s["median"] for s in stats]
    # Rates (MB/s) have their p95 on the slow side, below the median.
    up = [max(s["p95"] - s["median"], 0) for s in stats]
    down = [max(s["median"] - s["p95"], 0) for s in stats]
    y = list(range(len(stats)))
    ax.barh(y, med, xerr=[down, up], capsize=3, color="#4C72B0", ecolor="#333333", height=0.6)
    top = max([max(s["p95"], s["median"]) for s in stats] + [s.get("target", 0) for s in stats] + [s.get("target_p95", 0) for s in stats] + [1e-9])
    labelled = set()
    for i, s in enumerate(stats):
        ax.text(max(s["p95"], s["median"]) + top * 0.01, i, f'{fmt(s["median"])} (p95 {fmt(s["p95"])}, n={s["n"]})', va="center", fontsize=7)
        for key, style, lab in (("target", "--", "target p50"), ("target_p95", ":", "target p95")):
            t = s.get(key, 0)
            if t:
                ax.plot([t, t], [i - 0.42, i + 0.42], style, color="#C44E52", linewidth=2, label=None if lab in labelled else lab)
                labelled.add(lab)
    ax.set_xlim(0, top * 1.45)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    if labelled:
        ax.legend(fontsize=7, loc="lower right")


def density(ax, d):
    n = list(range(1, len(d["total_pss_mib_after_each"]) + 1))
    gib = [v / 1024 for v in d["total_pss_mib_after_each"]]
    ax.plot(n, gib, "o-", color="#4C72B0", markersize=3, label="summed PSS (GiB)")
    ax.axhline(d["limit_gib"], linestyle="--", color="#C44E52", label=f'{d["limit_gib"]:g} GiB budget')
    ax.set_xlabel("idle code-interpreter sandboxes", fontsize=8)
    ax.set_ylabel("GiB", fontsize=8)
    ax2 = ax.twinx()
    ax2.plot(n, d["create_ms"], "s", color="#55A868", markersize=3, label="create → run_code (ms)")
    ax2.set_ylabel("ms", fontsize=8)
    ax2.set_ylim(0, max(d["create_ms"] + [1]) * 1.6)
    ax.set_title(f'Density: {d["count"]} sandboxes\n({d["stop_reason"]})', fontsize=9)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", ncol=3)
    ax.set_ylim(0, d["limit_gib"] * 1.35)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        rep = json.load(f)
    groups = [(g, t, [s for s in rep.get("results") or [] if s["group"] == g and s["n"] > 0]) for g, t in PANELS]
    groups = [g for g in groups if g[2]]
    panels = len(groups) + (1 if rep.get("density") else 0)
    cols = 2
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 8.5, rows * 3.6), squeeze=False)
    flat = [a for row in axes for a in row]
    for ax, (_, title, stats) in zip(flat, groups):
        bars(ax, stats, title)
    if rep.get("density"):
        density(flat[len(groups)], rep["density"])
    for ax in flat[panels:]:
        ax.axis("off")
    m = rep["machine"]
    fig.suptitle(
        f'PandaStack benchmark, {rep["date"][:10]} on {rep["host"]}: {m.get("cores")} cores ({m.get("cpu")}), '
        f'{m.get("memory")} RAM, kernel {m.get("kernel")}, n={rep["settings"]["n"]}; bars: median, whiskers: p95',
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()

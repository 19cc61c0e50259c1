"""`cuforge report RUN -o report.html`: one self-contained HTML file (inline SVG, no CDN).

Sections: summary table; hgemm speedup heatmaps over M x N for each K; best-so-far speedup against
evaluations per problem; the winner's lineage; a roofline chart (achieved TFLOP/s against
arithmetic intensity, under the measured ceilings); failure kinds per proposer.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from typing import Any

from cuforge.results.leaderboard import baseline_words, Leaderboard

W, H, PAD = 640, 300, 48


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _svg(body: str, width: int = W, height: int = H, label: str = "") -> str:
    return (f'<svg class="chart" role="img" aria-label="{esc(label)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">{body}</svg>')


def color_for_speedup(s: float | None) -> str:
    """Diverging: red below 1x, white at 1x, green above (log scale, saturating at 4x / 0.25x)."""
    if s is None or s <= 0:
        return "#dddddd"
    t = max(-1.0, min(1.0, math.log(s) / math.log(4.0)))
    if t >= 0:
        r, g, b = int(255 * (1 - t)), int(255 - 80 * t), int(255 * (1 - t))
    else:
        r, g, b = 255 - int(40 * -t), int(255 * (1 + t)), int(255 * (1 + t))
    return f"#{r:02x}{g:02x}{b:02x}"


# ---------------------------------------------------------------------------------- charts

def heatmaps(board: Leaderboard) -> str:
    if not board.hgemm:
        return "<p>No hgemm problems in this run.</p>"
    by_k: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in board.hgemm:
        by_k[r["K"]].append(r)
    out = []
    for k in sorted(by_k):
        cells = by_k[k]
        ms, ns = sorted({c["M"] for c in cells}), sorted({c["N"] for c in cells})
        size = 34
        width, height = max(340, PAD + size * len(ns) + 10), PAD + size * len(ms) + 10
        parts = [f'<text x="{PAD}" y="14" font-size="12">K = {k}: speedup vs cuBLAS (rows M, columns N)</text>']
        for j, n in enumerate(ns):
            parts.append(f'<text x="{PAD + j * size + size / 2}" y="{PAD - 6}" font-size="9" text-anchor="middle">{n}</text>')
        for i, m in enumerate(ms):
            parts.append(f'<text x="{PAD - 4}" y="{PAD + i * size + size / 2 + 3}" font-size="9" text-anchor="end">{m}</text>')
        for c in cells:
            i, j = ms.index(c["M"]), ns.index(c["N"])
            s = c["measured_vs_cublas"]
            label = f"{c['M']}x{c['N']}x{k}: {s:.3f}x" if s else f"{c['M']}x{c['N']}x{k}: no correct result"
            parts.append(f'<rect x="{PAD + j * size}" y="{PAD + i * size}" width="{size - 1}" height="{size - 1}" '
                         f'fill="{color_for_speedup(s)}"><title>{esc(label)}</title></rect>')
            if s:
                parts.append(f'<text x="{PAD + j * size + size / 2}" y="{PAD + i * size + size / 2 + 3}" font-size="8" '
                             f'text-anchor="middle">{s:.2f}</text>')
        out.append(_svg("".join(parts), width, height, f"hgemm heatmap K={k}"))
    return "".join(out)


def _scale(v: float, lo: float, hi: float, a: float, b: float, log: bool = False) -> float:
    if log:
        v, lo, hi = math.log10(max(v, 1e-12)), math.log10(max(lo, 1e-12)), math.log10(max(hi, 1e-12))
    return a if hi == lo else a + (v - lo) / (hi - lo) * (b - a)


def best_so_far(evaluations: list[dict[str, Any]], baseline: str) -> str:
    series: dict[str, list[float]] = defaultdict(list)
    for ev in evaluations:
        s = (ev["speedups"] or {}).get(baseline) if ev["status"] == "ok" else None
        prev = series[ev["problem_id"]][-1] if series[ev["problem_id"]] else 0.0
        series[ev["problem_id"]].append(max(prev, s or 0.0))
    if not series:
        return "<p>No evaluations.</p>"
    top = max(max(v) for v in series.values()) or 1.0
    longest = max(len(v) for v in series.values())
    parts = [f'<text x="{PAD}" y="16" font-size="12">best speedup vs {esc(baseline)} so far, per evaluation</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#333"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>',
             f'<text x="{PAD - 4}" y="{PAD + 4}" font-size="9" text-anchor="end">{top:.2f}x</text>',
             f'<text x="{W - 10}" y="{H - PAD + 14}" font-size="9" text-anchor="end">{longest} evaluations</text>']
    one = _scale(1.0, 0, top * 1.05, H - PAD, PAD)
    parts.append(f'<line x1="{PAD}" y1="{one}" x2="{W - 10}" y2="{one}" stroke="#999" stroke-dasharray="4"/>')
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
    legend = []
    for idx, (pid, ys) in enumerate(sorted(series.items())):
        pts = " ".join(f"{_scale(i, 0, max(longest - 1, 1), PAD, W - 10):.1f},{_scale(y, 0, top * 1.05, H - PAD, PAD):.1f}"
                       for i, y in enumerate(ys))
        col = palette[idx % len(palette)]
        parts.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{pts}"><title>{esc(pid)}</title></polyline>')
        legend.append(f'<span style="color:{col}">&#9632; {esc(pid)} ({ys[-1]:.3f}x)</span>')
    return _svg("".join(parts), label="best so far") + "<p>" + " &nbsp; ".join(legend) + "</p>"


def roofline(board: Leaderboard, evaluations: list[dict[str, Any]], metas: dict[str, dict[str, Any]]) -> str:
    by_id = {ev["candidate_id"]: ev for ev in evaluations}
    points, ceilings = [], None
    for row in board.rows:
        ev = by_id.get(row.best_candidate_id)
        meta = metas.get(row.problem_id) or {}
        prof = (ev or {}).get("profile") or {}
        if not ev or not meta.get("flops") or not meta.get("bytes") or not prof.get("achieved_tflops"):
            continue
        ceilings = prof.get("ceilings") or ceilings
        points.append((row.problem_id, meta["flops"] / meta["bytes"], prof["achieved_tflops"], meta.get("dtype")))
    if not points or not ceilings:
        return "<p>No profiled winners with known FLOPs and bytes.</p>"
    bw = ceilings["bytes_per_s"] / 1e12  # TB/s
    peaks = {k: v / 1e12 for k, v in ceilings["flops_per_s"].items()}
    x_lo, x_hi = 0.01, max(1e4, max(p[1] for p in points) * 2)
    y_lo, y_hi = 1e-3, max(peaks.values()) * 2
    X = lambda x: _scale(x, x_lo, x_hi, PAD, W - 10, log=True)  # noqa: E731
    Y = lambda y: _scale(y, y_lo, y_hi, H - PAD, PAD, log=True)  # noqa: E731
    parts = [f'<text x="{PAD}" y="16" font-size="12">roofline: achieved TFLOP/s vs FLOP/byte (log-log), measured ceilings</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#333"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>']
    for dtype, peak in sorted(peaks.items()):
        knee = peak / bw
        pts = f"{X(x_lo):.1f},{Y(max(bw * x_lo, y_lo)):.1f} {X(knee):.1f},{Y(peak):.1f} {X(x_hi):.1f},{Y(peak):.1f}"
        parts.append(f'<polyline fill="none" stroke="#888" points="{pts}"><title>{esc(dtype)} {peak:.0f} TFLOP/s, '
                     f'{bw:.2f} TB/s</title></polyline>')
        parts.append(f'<text x="{W - 12}" y="{Y(peak) - 3:.1f}" font-size="9" text-anchor="end">{esc(dtype)} {peak:.0f}</text>')
    for pid, x, y, dtype in points:
        parts.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" fill="#d62728"><title>{esc(pid)}: '
                     f'{x:.2f} FLOP/B, {y:.2f} TFLOP/s ({esc(dtype)})</title></circle>')
    return _svg("".join(parts), label="roofline")


def failures_by_proposer(evaluations: list[dict[str, Any]]) -> str:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for ev in evaluations:
        counts[ev["proposer"] or "?"][ev["status"]] += 1
    statuses = sorted({s for c in counts.values() for s in c})
    head = "".join(f"<th>{esc(s)}</th>" for s in statuses)
    body = "".join(f"<tr><td>{esc(p)}</td>" + "".join(f"<td>{c.get(s, 0)}</td>" for s in statuses) + "</tr>"
                   for p, c in sorted(counts.items()))
    return f'<table class="sortable"><thead><tr><th>proposer</th>{head}</tr></thead><tbody>{body}</tbody></table>'


def lineage(board: Leaderboard, evaluations: list[dict[str, Any]], baseline: str) -> str:
    by_id = {ev["candidate_id"]: ev for ev in evaluations}
    blocks = []
    for row in board.rows:
        if row.best_candidate_id is None:
            continue
        chain, cid, seen = [], row.best_candidate_id, set()
        while cid is not None and cid in by_id and cid not in seen:
            seen.add(cid)
            ev = by_id[cid]
            s = (ev["speedups"] or {}).get(baseline)
            chain.append(f"#{cid} {esc(ev['proposer'])} gen {ev['generation']} {esc(ev['status'])}"
                         + (f" {s:.3f}x" if s else ""))
            cid = ev["parents"][0] if ev["parents"] else None
        blocks.append(f"<li><b>{esc(row.problem_id)}</b>: " + " &larr; ".join(chain) + "</li>")
    return "<ul>" + "".join(blocks) + "</ul>" if blocks else "<p>No winners yet.</p>"


def summary_table(board: Leaderboard) -> str:
    rows = "".join(
        f"<tr><td>{esc(r.problem_id)}</td><td>{f'{r.best_speedup:.3f}' if r.best_speedup else '-'}</td>"
        f"<td>{f'{r.best_median_ms:.4f}' if r.best_median_ms else '-'}</td><td>{100 * r.correct_rate:.0f}%</td>"
        f"<td>{r.evaluations}</td></tr>" for r in board.rows)
    fast = " &middot; ".join(f"{esc(k)} {100 * v:.0f}%" for k, v in board.fast.items())
    gm = f"{board.geomean_speedup:.3f}x" if board.geomean_speedup else "-"
    return (f"<p>{len(board.problems)} problems &middot; {fast} &middot; geomean of best {gm}</p>"
            f'<table class="sortable"><thead><tr><th>problem</th><th>best speedup vs {esc(board.baseline)}</th>'
            f"<th>best ms</th><th>correct</th><th>evaluations</th></tr></thead><tbody>{rows}</tbody></table>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#f3f3f3;cursor:pointer}
svg.chart{display:block;margin:10px 0;border:1px solid #eee}h2{margin-top:28px}
p.warn{background:#fde8e8;border:1px solid #e0a0a0;padding:6px 10px}"""

# Sorting by header click, and a self-check the tests read back: every chart drew something.
_SCRIPT = """document.querySelectorAll('table.sortable th').forEach(function(th, i){th.addEventListener('click', function(){
var tb=th.closest('table').tBodies[0];var rows=Array.from(tb.rows);var asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
rows.sort(function(a,b){var x=a.cells[i].textContent,y=b.cells[i].textContent;var nx=parseFloat(x),ny=parseFloat(y);
var c=(isNaN(nx)||isNaN(ny))?x.localeCompare(y):nx-ny;return asc?c:-c;});rows.forEach(function(r){tb.appendChild(r);});});});
var charts=Array.from(document.querySelectorAll('svg.chart'));var ok=charts.filter(function(s){var b=s.getBBox();
return b.width>0&&b.height>0&&s.querySelectorAll('rect,circle,polyline,line').length>0;}).length;
document.getElementById('selfcheck').textContent=JSON.stringify({charts:charts.length,rendered:ok});"""


def jail_line(evaluations: list[dict[str, Any]]) -> str:
    """Which jail confined the candidates; a run evaluated with --unsafe-no-jail says so plainly."""
    kinds = sorted({str((e.get("device") or {}).get("jail") or "unrecorded") for e in evaluations})
    if any(k.startswith("none") for k in kinds):
        return ('<p class="warn"><b>Candidates ran without a jail</b> (--unsafe-no-jail): they could read '
                f"this machine's files and keys. Jails: {esc(', '.join(kinds))}</p>")
    return f"<p>jail: {esc(', '.join(kinds)) if kinds else 'no evaluation'}</p>"


def not_searched(metas: dict[str, dict[str, Any]], skipped: list[tuple[str, str]]) -> str:
    """Problem files the suite could not load, and problems whose search ended early, each with the
    whole reason (tables elsewhere show its first line)."""
    rows = [(path, "not loaded", why) for path, why in skipped]
    rows += [(pid, "search ended", m["ended"]) for pid, m in sorted(metas.items()) if m.get("ended")]
    if not rows:
        return "<p>none</p>"
    body = "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td><pre>{esc(c)}</pre></td></tr>" for a, b, c in rows)
    return f"<table><tr><th>problem</th><th>what</th><th>why</th></tr>{body}</table>"


def render_report(run: Any, board: Leaderboard, evaluations: list[dict[str, Any]], metas: dict[str, dict[str, Any]],
                  usage: dict[str, float], skipped: list[tuple[str, str]] = ()) -> str:
    title = f"cuforge run {run.id}"
    cfg = esc(json.dumps(run.config, sort_keys=True))
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{esc(title)}</h1>
<p>status {esc(run.status)} &middot; suite {esc(run.suite)} &middot; GPU {esc(run.gpu)} &middot; {esc(run.software)}
&middot; {len(evaluations)} evaluations &middot; LLM calls {int(usage.get('calls', 0))}, ${usage.get('cost_usd', 0):.2f}</p>
{jail_line(evaluations)}
<p>speedups are against <b>{esc(board.baseline)}</b>: {esc(baseline_words(board.baseline, run.config.get("precision")))}</p>
<p><small>config: {cfg}</small></p>
<h2>Summary</h2>{summary_table(board)}
<h2>hgemm speedup heatmaps</h2>{heatmaps(board)}
<h2>Best so far</h2>{best_so_far(evaluations, board.baseline)}
<h2>Winners' lineage</h2>{lineage(board, evaluations, board.baseline)}
<h2>Roofline</h2>{roofline(board, evaluations, metas)}
<h2>Failure kinds per proposer</h2>{failures_by_proposer(evaluations)}
<h2>Not loaded or not searched to the end</h2>{not_searched(metas, list(skipped))}
<pre id="selfcheck"></pre>
<script>{_SCRIPT}</script>
</body></html>"""

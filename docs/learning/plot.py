#!/usr/bin/env python3
"""Draws the val (and train) reward of several runs' metrics.csv side by side, one panel a run,
into one SVG: docs/learning/plot.py OUT.svg TITLE LABEL=metrics.csv [LABEL=metrics.csv ...]
(plain SVG, no plotting library: the machines here have none)."""
import csv, sys

def load(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append(r)
    return rows

def series(rows, key):
    return [(int(r['version']), float(r[key])) for r in rows if r.get(key)]

out, title, runs = sys.argv[1], sys.argv[2], [a.split('=', 1) for a in sys.argv[3:]]
W, H, PW, PH, L, T = 330 * len(runs) + 40, 330, 270, 220, 50, 50
vmax = max(max(v for v, _ in series(load(p), 'train_reward_mean') + series(load(p), 'val_reward')) for _, p in runs)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
       f'<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{W/2}" y="22" font-size="15" text-anchor="middle">{title}</text>']
for i, (label, path) in enumerate(runs):
    rows = load(path)
    x0 = L + i * 330
    X = lambda v: x0 + v / max(vmax, 1) * PW
    Y = lambda r: T + PH - r * PH
    svg.append(f'<rect x="{x0}" y="{T}" width="{PW}" height="{PH}" fill="none" stroke="#888"/>')
    for r in (0, 0.25, 0.5, 0.75, 1.0):
        svg.append(f'<line x1="{x0}" y1="{Y(r)}" x2="{x0+PW}" y2="{Y(r)}" stroke="#ddd"/>')
        svg.append(f'<text x="{x0-4}" y="{Y(r)+4}" font-size="10" text-anchor="end">{r:g}</text>')
    for v in range(0, vmax + 1, max(1, vmax // 4)):
        svg.append(f'<text x="{X(v)}" y="{T+PH+14}" font-size="10" text-anchor="middle">{v}</text>')
    svg.append(f'<text x="{x0+PW/2}" y="{T-8}" font-size="12" text-anchor="middle">{label}</text>')
    svg.append(f'<text x="{x0+PW/2}" y="{T+PH+30}" font-size="11" text-anchor="middle">policy version</text>')
    for key, color, w in (('train_reward_mean', '#1f77b4', 1.2), ('val_reward', '#ff7f0e', 2)):
        pts = ' '.join(f'{X(v):.1f},{Y(r):.1f}' for v, r in series(rows, key))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="{w}" points="{pts}"/>')
        if key == 'val_reward':
            svg += [f'<circle cx="{X(v):.1f}" cy="{Y(r):.1f}" r="3" fill="{color}"/>' for v, r in series(rows, key)]
svg.append(f'<text x="{L}" y="{H-12}" font-size="11"><tspan fill="#1f77b4">train reward (mean of the version\'s rollouts)</tspan>'
           f'<tspan fill="#ff7f0e" dx="20">val reward (held-out tasks, greedy)</tspan></text></svg>')
open(out, 'w').write('\n'.join(svg) + '\n')

"""Draws the peer comparison from the figures `scripts/bench.sh peers` kept.

  plot_peers.py FIGURES_DIR IMAGE_DIR

FIGURES_DIR/rounds.txt holds the throughput rounds as bench.sh printed them
("round N  LABEL  RPS req/s  p99 X"); FIGURES_DIR/<name>.lat each contender's latency
distribution at a fixed rate ("PERCENTILE MS" a line, from loadgen's LATENCY_FILE).
Writes IMAGE_DIR/peers-throughput.png (median of the rounds, each round a dot) and
IMAGE_DIR/peers-latency.png (latency CDFs).
"""

import re
import statistics
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter, NullFormatter

ROUND = re.compile(r'^round (\d+)\s+(.+?)\s+([\d.]+) req/s\s+p99 (\S+)\s*$')
LATENCIES = [
    ('py-direct', 'Python SDK, direct'),
    ('py-gateway', 'Python SDK, behind the gateway'),
    ('js-direct', 'JavaScript SDK, direct'),
    ('js-gateway', 'JavaScript SDK, behind the gateway'),
]
COLOURS = {'direct': '#7f8c8d', 'gateway': '#2e86de'}


def colour(label: str) -> str:
    return COLOURS['gateway' if 'gateway' in label else 'direct']


def throughput(figures: Path, images: Path) -> None:
    rounds: dict[str, list[float]] = {}
    for line in (figures / 'rounds.txt').read_text().splitlines():
        m = ROUND.match(line)
        if m:
            rounds.setdefault(m.group(2), []).append(float(m.group(3)))
    if not rounds:
        sys.exit(f'no rounds in {figures / "rounds.txt"}')
    labels = list(rounds)
    medians = [statistics.median(rounds[label]) for label in labels]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = range(len(labels))
    ax.barh(y, medians, color=[colour(label) for label in labels])
    for i, label in enumerate(labels):
        ax.plot(rounds[label], [i] * len(rounds[label]), 'k.', markersize=4)
        ax.text(max(rounds[label]), i, f'  {medians[i]:,.0f}', va='center', fontsize=8)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xlabel('SendMessage requests per second (median of the rounds; dots: each round)')
    ax.set_title('Throughput, closed loop (wrk)')
    ax.set_xlim(0, max(max(v) for v in rounds.values()) * 1.18)
    fig.tight_layout()
    fig.savefig(images / 'peers-throughput.png', dpi=110)


def latency(figures: Path, images: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, label in LATENCIES:
        path = figures / f'{name}.lat'
        if not path.exists():
            sys.exit(f'missing {path}')
        points = [tuple(map(float, line.split())) for line in path.read_text().splitlines() if line.strip()]
        pcts = [p for p, _ in points]
        ms = [m for _, m in points]
        style = '-' if 'gateway' in name else '--'
        ax.plot(ms, pcts, style, label=label,
                color='#2e86de' if name.startswith('py') else '#e67e22')
    ax.set_xscale('log')
    low, high = ax.get_xlim()
    ax.set_xticks([t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if low <= t <= high])
    ax.xaxis.set_major_formatter(FormatStrFormatter('%g'))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel('latency, ms (log scale; timed from each request\'s scheduled start)')
    ax.set_ylabel('percentile')
    ax.set_title('Latency at a fixed rate (CDF)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(loc='center', fontsize=8)
    fig.tight_layout()
    fig.savefig(images / 'peers-latency.png', dpi=110)


def main() -> None:
    figures, images = Path(sys.argv[1]), Path(sys.argv[2])
    throughput(figures, images)
    latency(figures, images)
    print(f'wrote {images / "peers-throughput.png"} and {images / "peers-latency.png"}')


if __name__ == '__main__':
    main()

"""What `/metrics` shows, in Prometheus' text exposition format (version 0.0.4): counters,
gauges read when scraped, and the step latency histogram. No client library: a few lines of
text are all a scraper needs."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable

PREFIX = "codec_serve"
# Seconds of one `pool.step`: a tiny model's step is well under a millisecond, a released one on
# a CPU tens of milliseconds, a batch of many slots more.
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Cumulative buckets of observed values, their sum and count."""

    def __init__(self, buckets: tuple[float, ...] = STEP_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for le, n in zip([*map(_num, self.buckets), "+Inf"], self.counts):
            total += n
            out.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{le}"}} {total}')
        braces = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{braces} {_num(self.sum)}", f"{name}_count{braces} {self.count}"]


def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


class Metrics:
    """The server's numbers. Counters only grow; the gauges come from `gauges()` at scrape time
    (slots, connections, queue)."""

    def __init__(self, sides: tuple[str, ...], gauges: Callable[[], dict[str, list[tuple[str, float]]]]):
        self.sides = sides
        self.steps = {side: Histogram() for side in sides}
        self.step_slots = Counter()  # slots stepped, summed over steps, per side (the mean batch)
        self.frames = Counter()  # code frames out of encoders / into decoders, per side
        self.samples = Counter()  # samples into encoders / out of decoders, per side
        self.streams = Counter()  # streams opened, per op
        self.done = Counter()  # streams that ended with done, per op
        self.errors = Counter()  # error messages sent, per code
        self.busy = 0  # connections refused for want of a slot (no queue, queue full or timed out)
        self.drops = 0  # slow readers dropped
        self.warnings = 0  # "behind" warnings sent
        self.gauges = gauges

    def step(self, side: str, seconds: float, slots: int) -> None:
        self.steps[side].observe(seconds)
        self.step_slots[side] += slots

    def render(self) -> str:
        p, out = PREFIX, []

        def family(name: str, kind: str, help_: str, rows) -> None:
            out.append(f"# HELP {p}_{name} {help_}")
            out.append(f"# TYPE {p}_{name} {kind}")
            for labels, value in rows:
                out.append(f"{p}_{name}{{{labels}}} {_num(value)}" if labels else f"{p}_{name} {_num(value)}")

        def per_side(c: Counter):
            return [(f'side="{s}"', c[s]) for s in self.sides]

        for name, (kind, help_) in GAUGES.items():
            family(name, kind, help_, self.gauges().get(name, []))
        family("frames_total", "counter", "Code frames out of encoder slots and into decoder slots.",
               per_side(self.frames))
        family("samples_total", "counter",
               "Samples (model rate) into encoder slots and out of decoder slots.",
               per_side(self.samples))
        family("step_slots_total", "counter", "Slots stepped, summed over steps (over the step count: "
                                              "the mean batch).", per_side(self.step_slots))
        out.append(f"# HELP {p}_step_seconds Seconds of one pool step (all the slots ready at once).")
        out.append(f"# TYPE {p}_step_seconds histogram")
        for side in self.sides:
            out.extend(self.steps[side].lines(f"{p}_step_seconds", f'side="{side}"'))
        family("streams_total", "counter", "Streams that got a slot, by op.",
               [(f'op="{k}"', v) for k, v in sorted(self.streams.items())])
        family("streams_done_total", "counter", "Streams that ended with done, by op.",
               [(f'op="{k}"', v) for k, v in sorted(self.done.items())])
        family("errors_total", "counter", "Error messages sent (each closes its connection), by code.",
               [(f'code="{k}"', v) for k, v in sorted(self.errors.items())])
        family("busy_total", "counter", "Connections refused for want of a slot.", [("", self.busy)])
        family("drops_total", "counter", "Slow readers dropped (output backlog past --max-backlog).",
               [("", self.drops)])
        family("behind_warnings_total", "counter", "Warnings sent to slow readers.", [("", self.warnings)])
        return "\n".join(out) + "\n"


GAUGES = {
    "slots": ("gauge", "Slots of each pool (--slots)."),
    "active_slots": ("gauge", "Slots held by a stream."),
    "connections": ("gauge", "Open WebSocket connections (streaming, queued or in the handshake)."),
    "queued": ("gauge", "Connections waiting for a slot (--queue)."),
    "draining": ("gauge", "1 once SIGTERM has stopped new connections."),
}


def merge(texts: dict[str, str], label: str = "replica") -> str:
    """Several servers' `render()` texts as one exposition: each sample labelled `label="<key>"`,
    each family's samples together under one HELP and TYPE (the text format wants them so)."""
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for key, text in texts.items():
        tag = f'{label}="{key}"'
        family = ""
        for line in text.splitlines():
            if line.startswith("# "):
                family = line.split()[2]
                heads.setdefault(family, [])
                if len(heads[family]) < 2:
                    heads[family].append(line)
                continue
            if not line:
                continue
            name, _, value = line.rpartition(" ")
            name = f"{name[:-1]},{tag}}}" if name.endswith("}") else f"{name}{{{tag}}}"
            samples.setdefault(family, []).append(f"{name} {value}")
    out = []
    for family, lines in heads.items():
        out.extend(lines)
        out.extend(samples.get(family, []))
    return "\n".join(out) + "\n"

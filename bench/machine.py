"""The machine line every bench result carries (the cores here are shared: say what they were)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe(with_load: bool = True) -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = f"nproc={nproc}, {cpu}, Linux {platform.release()}, Python {platform.python_version()}"
    if with_load:
        text += ", load average at start " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    return text

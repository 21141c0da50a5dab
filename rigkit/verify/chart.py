"""A PNG of clocks, power and temperature over a verification run, with the policy's lines drawn."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on rigs or CI
import matplotlib.pyplot as plt  # noqa: E402

from rigkit.config.schema import RigConfig  # noqa: E402


def draw(path: Path, rig: RigConfig, model_name: str, telemetry: dict) -> Path:
    policy = {g.index: g for g in rig.spec.gpus}
    fig, (clock_ax, power_ax, temp_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    t0 = telemetry["t_start"]
    for gpu in telemetry["gpus"]:
        s = gpu["samples"]
        t = [x - t0 for x in s["t"]]
        label = f"GPU {gpu['index']}"
        clock_ax.plot(t, s["sm_mhz"], label=f"{label} SM")
        power_ax.plot(t, s["power_instant_w"], label=f"{label} instant", linewidth=0.8)
        power_ax.plot(t, s["power_average_w"], label=f"{label} 1 s average", linestyle=":")
        temp_ax.plot(t, s["temp_c"], label=label)
        spec = policy.get(gpu["index"])
        if spec and spec.clock_lock_mhz:
            clock_ax.axhline(spec.clock_lock_mhz.ceiling_mhz, color="red", linestyle="--",
                             label=f"{label} lock ceiling {spec.clock_lock_mhz.ceiling_mhz} MHz")
        if spec and spec.power_limit_w:
            power_ax.axhline(spec.power_limit_w, color="red", linestyle="--", label=f"{label} cap {spec.power_limit_w} W")
    clock_ax.set_ylabel("MHz")
    power_ax.set_ylabel("W")
    temp_ax.set_ylabel("°C")
    temp_ax.set_xlabel("seconds")
    simulated = " (SIMULATED telemetry)" if telemetry.get("simulated") else ""
    clock_ax.set_title(f"{rig.name} / {model_name}: clocks, power, temperature under load{simulated}")
    for ax in (clock_ax, power_ax, temp_ax):
        ax.legend(loc="lower right", fontsize="small")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

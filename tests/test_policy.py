"""GPU policy checks and rendering: pure functions, no rig."""

from __future__ import annotations

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport, GpuStatus
from rigkit.gpu.policy import power_drift, psu_budget, range_problems
from rigkit.plumbing.render import render


def rig(caps, psu_w=1200, system_w=200, **extra) -> RigSpec:
    gpus = [{"index": i, "model": "RTX 4090", "power_limit_w": c, "clock_lock_mhz": [0, 2200]} for i, c in enumerate(caps)]
    return RigSpec.model_validate({"os": "linux", "psu_w": psu_w, "system_w": system_w, "gpus": gpus, **extra})


def report(limits, lo=150.0, hi=450.0, default=450.0) -> GpuReport:
    return GpuReport(tuple(
        GpuStatus(i, "NVIDIA GeForce RTX 4090", f"GPU-{i}", w, w, default, lo, hi, True, 3105, 49140)
        for i, w in enumerate(limits)
    ))


def test_psu_budget_two_330w_cards_pass():
    budget = psu_budget(rig([330, 330]), {})
    assert budget.ok
    assert budget.total_w == 860 and budget.free_w == 340


def test_psu_budget_two_450w_cards_fail_and_show_the_arithmetic():
    budget = psu_budget(rig([450, 450]), {})
    assert not budget.ok
    assert budget.arithmetic() == (
        "GPU caps 450 + 450 W + 200 W system = 1100 W on a 1200 W PSU leaves 100 W (8%) free; "
        "20% (240 W) must stay free for transient spikes"
    )


def test_psu_budget_counts_an_uncapped_gpu_at_its_default_limit():
    spec = rig([330, None])
    assert psu_budget(spec, {0: 450.0, 1: 450.0}).total_w == 330 + 450 + 200


def test_psu_headroom_share_is_configurable():
    assert psu_budget(rig([450, 450], psu_headroom_share=0.05), {}).ok


def test_cap_outside_the_range_the_rig_reports():
    [problem] = range_problems(rig([330, 500]), report([450, 450]))
    assert problem == "GPU 1: power_limit_w 500 W is outside 150-450 W, the range this NVIDIA GeForce RTX 4090 reports"
    assert range_problems(rig([330, 330]), report([450, 450])) == []


def test_power_drift_names_gpu_current_and_wanted():
    assert power_drift(rig([330, 330]), report([330, 300])) == ["GPU 1: power limit is 300 W, policy says 330 W"]
    assert power_drift(rig([330, 330]), report([330, 330])) == []
    assert power_drift(rig([330, None]), report([330, 400])) == ["GPU 1: power limit is 400 W, policy says 450 W"]


def test_policy_file_lists_each_gpu_and_defaults():
    spec = RigSpec.model_validate({
        "os": "linux", "psu_w": 1200, "system_w": 200,
        "gpus": [{"index": 0, "model": "RTX 4090", "power_limit_w": 330, "clock_lock_mhz": 2200},
                 {"index": 1, "model": "RTX 4090"}],
    })
    text = render("gpu_policy/gpu-policy.conf.j2", rig_name="r", rig_file="r.yml", gpus=spec.gpus)
    rows = [line for line in text.splitlines() if not line.startswith("#")]
    assert rows == ["0 330 0,2200", "1 default default"]


def test_policy_file_adds_clock_offsets_only_where_declared():
    spec = RigSpec.model_validate({
        "os": "linux", "psu_w": 1200, "system_w": 200,
        "gpus": [{"index": 0, "model": "RTX 4090", "clock_offsets_mhz": {"memory": 1800, "graphics": -50}},
                 {"index": 1, "model": "RTX 4090"}],
    })
    text = render("gpu_policy/gpu-policy.conf.j2", rig_name="r", rig_file="r.yml", gpus=spec.gpus)
    rows = [line for line in text.splitlines() if not line.startswith("#")]
    assert rows == ["0 default default 1800,-50", "1 default default"]


def test_unit_orders_after_persistenced_and_before_docker():
    text = render(
        "gpu_policy/rigkit-gpu-policy.service.j2",
        script_path="/s", policy_path="/p", wait_for_gpus_s=120, lock_wait_s=150, before_units=["rigkit-stack.target"],
    )
    assert "After=nvidia-persistenced.service" in text
    assert "Before=docker.service containerd.service rigkit-stack.target" in text
    assert "ExecStart=/s apply /p" in text
    assert "TimeoutStartSec=330" in text  # a keeper's repair waited for (150 s), the GPUs (120 s), and 60 s more
    assert "WantedBy=multi-user.target" in text

import pytest

from ddptop.model.config import (
    PRESETS,
    ConfigError,
    RunConfig,
    apply_overrides,
    preset_config,
    validate,
)


def test_every_preset_builds_and_validates():
    for name in PRESETS:
        cfg = preset_config(name, RunConfig(nproc=4, steps=10))
        assert cfg.preset == name
        assert cfg.steps == 10


def test_single_is_one_process_without_ddp():
    cfg = preset_config("single", RunConfig(nproc=8))
    assert not cfg.ddp and cfg.nproc == 1 and cfg.world_size == 1


def test_powersgd_preset_compresses_from_the_start():
    cfg = preset_config("powersgd")
    assert cfg.comm_hook == "powersgd"
    assert cfg.powersgd_start_iter <= 2  # not torch's default 1000 (see DESIGN.md)


def test_preset_resets_knobs_of_the_previous_preset():
    bf16 = preset_config("bf16")
    back = preset_config("baseline", bf16)
    assert back.comm_hook == "none" and not back.static_graph and back.bucket_cap_mb == 2000


def test_overlap_uses_small_buckets_on_top_of_view():
    cfg = preset_config("overlap")
    assert cfg.bucket_cap_mb == 100 and cfg.static_graph and cfg.gradient_as_bucket_view


def test_overrides_parse_types():
    cfg = apply_overrides(
        RunConfig(),
        ["bucket_cap_mb=50", "static_graph=true", "steps=7", "comm_hook=fp16", "nccl_env.NCCL_ALGO=Ring"],
    )
    assert cfg.bucket_cap_mb == 50.0 and cfg.static_graph is True and cfg.steps == 7
    assert cfg.comm_hook == "fp16" and cfg.nccl_env == {"NCCL_ALGO": "Ring"}


@pytest.mark.parametrize(
    "pairs, fragment",
    [
        (["unknown=1"], "unknown setting 'unknown'"),
        (["steps=abc"], "not a valid int"),
        (["static_graph=maybe"], "not a valid bool"),
        (["comm_hook=zip"], "comm_hook must be one of"),
        (["nproc"], "expects key=value"),
        (["powersgd_start_iter=1"], "at least 2"),
        (["warmup=500"], "warmup (500) must be smaller than steps"),
        (["preset=bf16"], "--preset"),
    ],
)
def test_bad_overrides_are_one_line_errors(pairs, fragment):
    with pytest.raises(ConfigError) as info:
        apply_overrides(RunConfig(), pairs)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ConfigError, match="valid: single, baseline"):
        preset_config("nosuch")


def test_hook_without_ddp_is_rejected():
    with pytest.raises(ConfigError):
        validate(RunConfig(ddp=False, comm_hook="bf16"))


def test_round_trip_through_dict():
    cfg = apply_overrides(preset_config("bf16-overlap"), ["nccl_env.NCCL_P2P_DISABLE=1"])
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError):
        RunConfig.from_dict({**cfg.to_dict(), "bogus": 1})


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "NCCL_NET_PLUGIN", "CUDA_INJECTION64_PATH",
                                  "NCCL_DEBUG_FILE", "HOME"])
def test_nccl_env_refuses_what_would_load_code_or_move_files(name):
    with pytest.raises(ConfigError, match=f"nccl_env: {name} is not allowed"):
        apply_overrides(RunConfig(), [f"nccl_env.{name}=x"])


def test_nccl_env_takes_communication_settings():
    cfg = apply_overrides(RunConfig(), ["nccl_env.NCCL_P2P_DISABLE=1", "nccl_env.CUDA_VISIBLE_DEVICES=0",
                                        "nccl_env.TORCH_NCCL_BLOCKING_WAIT=1", "nccl_env.GLOO_SOCKET_IFNAME=lo"])
    assert len(cfg.nccl_env) == 4


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH"])
def test_cli_refuses_a_dangerous_nccl_env_with_one_line(name):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--set", f"nccl_env.{name}=x"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "is not allowed" in res.stderr


def test_cost_flag_sets_one_step_blocks_with_the_checks_and_bad_counts_are_one_line_errors(tmp_path):
    import argparse
    import subprocess
    import sys

    from ddptop.cli import build_config

    base = {"nproc": 2, "steps": None, "warmup": None, "batch_size": None, "model": None, "preset": None,
            "overrides": []}
    config = build_config(argparse.Namespace(**base, cost=500), script=True)
    assert (config.cost_ab, config.cost_ab_blocks, config.cost_ab_arms) == (0.001, 500, "on,off,aa,busy")
    config = build_config(argparse.Namespace(**base | {"overrides": ["cost_ab_arms=on,off"]}, cost=500), script=True)
    assert config.cost_ab_arms == "on,off"  # --set still has the last word
    assert build_config(argparse.Namespace(**base, cost=None)).cost_ab == 0.0
    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(tmp_path / "runs"),
                          "--cost", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == "" and not (tmp_path / "runs").exists()
    assert res.stderr.strip().splitlines() == ["ddptop: error: --cost wants a number of steps, 1 or more, got 0"]

"""Slurm: the host-list parser, what SLURM_* fill in (and what flags keep), the derived token,
and two "nodes" on this machine started the way srun starts them, for real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptop import cli
from ddptop.run import slurm
from ddptop.run.slurm import (
    SlurmStep,
    apply_slurm,
    derived_token,
    expand_hostlist,
    read_or_make_key,
)
from ddptop.wire import protocol


@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
    ("gpu[008-011]", ["gpu008", "gpu009", "gpu010", "gpu011"]),
    ("node[9-11]", ["node9", "node10", "node11"]),
    ("login1", ["login1"]),
    ("n5,n7", ["n5", "n7"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("c[1,3]-[a],x", None),  # a letter in brackets: an error, not a guess
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
    (" node[1] ", ["node1"]),
])
def test_host_list_expands_compressed_forms(text, hosts):
    if hosts is None:
        with pytest.raises(ValueError):
            expand_hostlist(text)
    else:
        assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-2", "node1-2]", "a[3-1]", "", "n[0-99999999]", "n[1-2]]"])
def test_host_list_errors_are_one_line(text):
    with pytest.raises(ValueError) as err:
        expand_hostlist(text)
    assert "\n" not in str(err.value)


def step_env(node_id: int, key: Path, job: str = "4242", nodes: str = "node[01-02]", **extra: str) -> dict[str, str]:
    """What srun puts in the environment of one task of `srun --nodes 2 --ntasks-per-node 1`."""
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
            "SLURM_NODEID": str(node_id), "SLURM_JOB_NODELIST": nodes, "SLURM_STEP_NODELIST": nodes,
            "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", slurm.KEY_ENV: str(key), **extra}


def parse(argv: list[str], env: dict[str, str]):
    args = cli.run_parser().parse_args(argv)
    return apply_slurm(args, env), args


def test_srun_fills_nnodes_node_rank_endpoint_and_a_token_both_nodes_agree_on(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda _: None)  # no scontrol here: our own expansion
    key = tmp_path / "home" / "slurm.key"
    envs = [step_env(i, key) for i in (0, 1)]
    (s0, a0), (s1, a1) = parse([], envs[0]), parse([], envs[1])
    assert s0 is not None and s1 is not None
    assert (a0.nnodes, a0.node_rank, a1.node_rank) == (2, 0, 1)
    assert a0.rdzv_endpoint == a1.rdzv_endpoint == f"node01:{s0.rdzv_port}"
    assert 20000 <= s0.rdzv_port < 32000 and s0.rdzv_port % 2 == 0
    token = envs[0][protocol.ENV_TOKEN]
    assert token == envs[1][protocol.ENV_TOKEN] and len(token) == 32
    assert key.stat().st_mode & 0o777 == 0o600
    assert s0.run_id("baseline") == "slurm-4242.0-baseline"
    # another job (or step) of the same user: another token and another port
    other = step_env(0, key, job="4243")
    parse([], other)
    assert other[protocol.ENV_TOKEN] != token
    assert derived_token(SlurmStep("4242", "0", 2, 0, "x", 2), read_or_make_key(key)) == token
    # the whole path: NodeOptions as the CLI builds them
    node = cli.node_options(a1, envs[1])
    assert (node.nnodes, node.node_rank, node.rdzv_host, node.token) == (2, 1, "node01", token)


def test_flags_win_over_slurm_and_an_explicit_token_is_kept(tmp_path):
    key = tmp_path / "slurm.key"
    env = step_env(1, key, **{protocol.ENV_TOKEN: "mine"})
    step, args = parse(["--node-rank", "0", "--rdzv-endpoint", "head:29500"], env)
    assert step is not None and (args.nnodes, args.node_rank, args.rdzv_endpoint) == (2, 0, "head:29500")
    assert env[protocol.ENV_TOKEN] == "mine" and not key.exists()
    env = step_env(1, key)
    step, args = parse(["--nnodes", "1"], env)  # the user chose one node: Slurm is not consulted
    assert step is None and args.nnodes == 1 and protocol.ENV_TOKEN not in env


@pytest.mark.parametrize("changes", [
    {"SLURM_STEP_ID": ""},  # the batch script itself, not a task srun started
    {"SLURM_STEP_ID": "batch"},
    {"SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1"},  # one node: a plain run
    {"SLURM_JOB_ID": ""},
])
def test_outside_a_multi_node_srun_step_nothing_changes(tmp_path, changes):
    step, args = parse([], {**step_env(0, tmp_path / "k"), **changes})
    assert step is None and args.nnodes is None


def test_more_than_one_task_per_node_or_a_shared_key_is_a_usage_error(tmp_path):
    with pytest.raises(ValueError, match="--ntasks-per-node 1"):
        parse([], step_env(0, tmp_path / "k", SLURM_NTASKS="16", SLURM_STEP_NUM_TASKS="16"))
    key = tmp_path / "open.key"
    key.write_text("x" * 64)
    key.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        parse([], step_env(0, key))


def test_node0_under_srun_prints_no_join_command_and_no_token(tmp_path, monkeypatch):
    from ddptop.model.config import RunConfig
    from ddptop.model.options import NodeOptions
    from ddptop.run.multinode import join_instructions

    node = NodeOptions(nnodes=2, node_rank=0, rdzv_host="node01", rdzv_port=20000, hub_port=20001, token="t0ps3cret")
    assert "t0ps3cret" in join_instructions(RunConfig(), node)  # by hand: the command to copy
    for key, value in step_env(0, tmp_path / "k").items():
        monkeypatch.setenv(key, value)
    text = join_instructions(RunConfig(), node)
    assert "t0ps3cret" not in text and "Slurm step 4242.0 join by themselves" in text


# ---------------------------------------------------------------------------- real runs


def slurm_job_with_free_ports() -> SlurmStep:
    """A job id whose rendezvous port (and the hub's, +1) are free here."""
    for job in range(int(time.time()) % 100000, int(time.time()) % 100000 + 200):
        step = SlurmStep(str(job), "0", 2, 0, "127.0.0.[1-2]", 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", step.rdzv_port))
                b.bind(("127.0.0.1", step.rdzv_port + 1))
        except OSError:
            continue
        return step
    raise AssertionError("no job id with a free port pair")


@pytest.mark.e2e
@pytest.mark.slow  # ~25-40 s on 2 busy cores: `pytest -m slow tests/run/test_slurm.py`
def test_two_nodes_started_like_srun_run_a_2x2_job_with_one_summary(tmp_path):
    """One ddptop per "node", each with only what srun gives it: a 2-node job's SLURM_*
    (the host list 127.0.0.[1-2], both loopback here) and a shared home for the key."""
    job = slurm_job_with_free_ports()
    home = tmp_path / "home"
    procs = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != protocol.ENV_TOKEN}
    t0 = time.monotonic()
    try:
        for node_id in (0, 1):
            cwd = tmp_path / f"node{node_id}"
            cwd.mkdir()
            env = {**base, **step_env(node_id, home / "slurm.key", job=job.job_id, nodes="127.0.0.[1-2]"),
                   "XDG_CONFIG_HOME": str(home)}
            cmd = [sys.executable, "-m", "ddptop", "--nproc", "2", "--steps", "6", "--interval", "1",
                   "--set", "workers=0", "--set", "batch_size=8"]
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        out1, _ = procs[1].communicate(timeout=240)
        out0, _ = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(f"two Slurm nodes: {time.monotonic() - t0:.1f} s")
    assert procs[0].returncode == 0, out0[-3000:]
    assert procs[1].returncode == 0, out1[-3000:]
    token = derived_token(job, read_or_make_key(home / "slurm.key"))
    assert token not in out0 + out1  # the job's output file may be readable by others
    assert f"Slurm job {job.job_id}.0: node 0 of 2" in out0 and "node 1 of 2" in out1
    assert "the live view is on node 0" in out1
    run0 = tmp_path / "node0" / "ddptop-runs" / f"slurm-{job.job_id}.0-baseline"
    run1 = tmp_path / "node1" / "ddptop-runs" / f"slurm-{job.job_id}.0-baseline-node1"
    summaries = list(tmp_path.glob("node*/ddptop-runs/*/summary.json"))
    assert summaries == [run0 / "summary.json"], summaries
    summary = json.loads(summaries[0].read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 4 and summary["nnodes"] == 2
    assert [r["steps"] for r in summary["ranks"]] == [6] * 4
    assert sorted(r["node"] for r in summary["ranks"]) == [0, 0, 1, 1]
    assert run1.is_dir()
    leaks = [p for p in tmp_path.glob("node*/ddptop-runs/**/*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == []  # nor in any record (node 0's log says the others join by themselves)

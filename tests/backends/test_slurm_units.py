"""The slurm backend's command lines, parsing, placement and launch-spec roles (no Slurm run).

The pyxis argv is pinned against InferenceX's MI355X runner (`srun --jobid=ID
--container-image=<file>.sqsh --container-mounts=... --container-writable --container-workdir=
--container-remap-root --no-container-entrypoint`): pyxis and enroot cannot run here, so the
exact words are what is checked. `enroot` itself is a stand-in script where an import is needed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from lifecycle_helpers import load_node, write_recipe

from pytest_inferbench.backends.base import ServerStartError
from pytest_inferbench.backends.slurm import commands, layout, pyxis
from pytest_inferbench.options import Settings, SlurmSettings
from pytest_inferbench.recipe.launch import LaunchSpecError

IMAGE = "rocm/atom-dev:MiniMax-M3-20260623"


def test_salloc_asks_for_the_nodes_gpus_and_the_users_options() -> None:
    settings = SlurmSettings(partition="compute", account="perf", time="500", exclusive=True,
                             args=("--exclude=n09,n11", "--cpus-per-task=128"))
    argv = commands.salloc_argv(settings, name="inferbench-r1-gw0-node", comment="c",
                                nodes=1, gpus_per_node=4)
    assert argv == ("salloc", "--no-shell", "--job-name=inferbench-r1-gw0-node", "--comment=c",
                    "--nodes=1", "--partition=compute", "--account=perf", "--time=500",
                    "--exclusive", "--gres=gpu:4", "--exclude=n09,n11", "--cpus-per-task=128")
    bare = commands.salloc_argv(SlurmSettings(gres=""), name="n", comment="c", nodes=3,
                                gpus_per_node=8)
    assert bare == ("salloc", "--no-shell", "--job-name=n", "--comment=c", "--nodes=3")


def test_the_pyxis_srun_argv_is_the_runners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    hub = tmp_path / "hf-hub"
    hub.mkdir()
    monkeypatch.chdir(tmp_path)
    settings = SlurmSettings(squash_dir=Path("/var/lib/squash"),
                             container_mounts=("/it-share/aiperf-cache:/aiperf_mmap_cache:rw",))
    squash = pyxis.squash_path(settings.squash_dir, IMAGE)
    words, env = pyxis.container_args(squash, settings, ("/models:/models",),
                                      {"HF_HUB_CACHE": str(hub)})
    argv = commands.srun_argv("4242", "gpu-n07", ("python3", "-m", "atom.server", "--x", "a b"),
                              container=words)
    assert argv == (
        "srun", "--jobid=4242", "--nodes=1", "--ntasks=1", "--nodelist=gpu-n07", "--overlap",
        "--export=ALL",
        "--container-image=/var/lib/squash/rocm_atom-dev_MiniMax-M3-20260623.sqsh",
        f"--container-mounts={tmp_path}:/workspace,{hub}:/root/.cache/huggingface/hub,"
        "/models:/models:ro,/it-share/aiperf-cache:/aiperf_mmap_cache",
        "--container-writable", "--container-workdir=/workspace", "--container-remap-root",
        "--no-container-entrypoint", "--", "python3", "-m", "atom.server", "--x", "a b")
    assert env == {"HF_HUB_CACHE": "/root/.cache/huggingface/hub"}
    words, env = pyxis.container_args(squash, settings, (), {"HF_HUB_CACHE": str(tmp_path / "x")})
    assert "huggingface" not in " ".join(words) and env == {}  # no cache on this host: no mount


@pytest.mark.parametrize(("image", "uri"), [
    (IMAGE, f"docker://{IMAGE}"),
    ("vllm/vllm-openai:v0.11.0", "docker://vllm/vllm-openai:v0.11.0"),
    ("nvcr.io/nvidia/pytorch:24.01-py3", "docker://nvcr.io#nvidia/pytorch:24.01-py3"),
    ("localhost:5000/sim:1", "docker://localhost:5000#sim:1"),
    ("ubuntu", "docker://ubuntu"),
])
def test_enroot_spells_registries_with_a_hash(image: str, uri: str) -> None:
    assert pyxis.enroot_uri(image) == uri


def test_an_image_is_imported_once_then_reused(tmp_path: Path, fake_enroot: Path) -> None:
    squash_dir = tmp_path / "squash"
    first = pyxis.ensure_squash(IMAGE, squash_dir, tmp_path / "import.log")
    second = pyxis.ensure_squash(IMAGE, squash_dir, tmp_path / "import2.log")
    assert first == second == squash_dir / "rocm_atom-dev_MiniMax-M3-20260623.sqsh"
    assert fake_enroot.read_text().splitlines() == [
        f"import --output {first}.tmp-{os.getpid()} docker://{IMAGE}"]
    assert sorted(p.name for p in squash_dir.iterdir()) == [first.name, first.name + ".lock"]


def test_a_failed_import_says_why_and_leaves_no_file(tmp_path: Path, fake_enroot: Path) -> None:
    squash_dir = tmp_path / "squash"
    with pytest.raises(ServerStartError, match=r"(?s)enroot import of registry.example/fail:1 "
                       r"exited with code 1.*401 Unauthorized"):
        pyxis.ensure_squash("registry.example/fail:1", squash_dir, tmp_path / "import.log")
    assert [p.name for p in squash_dir.iterdir()] == ["registry.example_fail_1.sqsh.lock"]


def test_job_info_and_salloc_answers_are_read() -> None:
    text = ("JobId=17 JobName=inferbench-x JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
            "ExitCode=0:15 NodeList=gpu-[01-02] BatchHost=gpu-01")
    info = commands.parse_job_info("17", text)
    assert (info.state, info.reason, info.nodelist, info.live) == (
        "TIMEOUT", "TimeLimit", "gpu-[01-02]", False)
    assert info.describe() == "slurm job 17 TIMEOUT, reason TimeLimit"
    assert commands.parse_job_info("17", "").describe() == (
        "slurm job 17 is no longer known to slurmctld")
    queued = ("salloc: Pending job allocation 9\nsalloc: job 9 queued and waiting for "
              "resources\nsalloc: Granted job allocation 9")
    assert commands.granted_job_id(queued) == "9"
    assert commands.granted_job_id("salloc: Pending job allocation 9\n") is None
    assert commands.announced_job_id("salloc: Pending job allocation 9\n") == "9"
    comment = commands.job_comment("host-a:123", "run1")
    assert commands.comment_owner(comment) == "host-a:123"
    assert commands.comment_owner("someone else's job") is None


def test_roles_are_placed_in_turn_and_their_addresses_filled(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)
    (tmp_path / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text("""\
command: [serve, "{model}"]
port: 30000
roles:
  prefill: { count: 2, args: [--port, "{port}", --tp, "{tp}"], env: { ROLE: p } }
  decode: { count: 1, args: [--port, "{port}", --peers, "{hosts:prefill}"], srun-args: [-c8] }
  router:
    command: [router, --bind, "{host}:{port}"]
    args: [--prefill, "{addrs:prefill}", --decode, "{addrs:decode}"]
""")
    _, spec = load_node(recipe)
    assert layout.nodes_needed(spec) == 4
    placed = layout.place(spec, ["n1", "n2", "n3", "n4"], local=lambda host: False)
    assert [(i.label, i.address) for i in placed] == [
        ("prefill.0", "n1:30000"), ("prefill.1", "n2:30000"), ("decode.0", "n3:30000"),
        ("router.0", "n4:30000")]
    assert placed[0].argv == ("serve", "amd/MiniMax-M3-MXFP4", "--port", "30000", "--tp", "1")
    assert placed[2].argv[-1] == "n1,n2" and placed[2].srun_args == ("-c8",)
    assert placed[3].argv == ("router", "--bind", "n4:30000", "--prefill",
                              "n1:30000,n2:30000", "--decode", "n3:30000")
    assert dict(placed[0].env)["ROLE"] == "p"
    assert layout.serving(placed, spec).label == "router.0"
    shared = layout.place(spec, ["n1"], local=lambda host: False)
    assert [i.address for i in shared] == ["n1:30000", "n1:30001", "n1:30002", "n1:30003"]


@pytest.mark.parametrize(("body", "error"), [
    ("roles: {w: {count: 0, args: [x]}}\ncommand: [s]", r"roles.w.count: 0 \(expected an integ"),
    ("roles: {w: {cuont: 1}}\ncommand: [s]", r"roles.w.cuont: unknown key"),
    ("roles: {w: {args: [x]}}\ncommand: [s]", r"serve-role: 'router' is not one of the roles"),
    ("roles: {w: {args: [x]}}\nargs: [y]\ncommand: [s]", r"roles: give args per role"),
    ("roles: {w: {args: [x]}}\noverlays: {mtp: {args: [y]}}\ncommand: [s]",
     r"overlays.mtp.args: with roles, top-level overlays set only client"),
    ("roles: {router: {count: 1}}", r"roles.router: no command"),
    ("roles: []\ncommand: [s]", r"roles: empty"),
    ("roles: {w: {args: [x], settings: [A=1]}}\ncommand: [s]",
     r"roles.w.settings: expected a mapping"),
])
def test_bad_roles_are_named_with_the_file(tmp_path: Path, body: str, error: str) -> None:
    recipe = write_recipe(tmp_path)
    (tmp_path / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text(body)
    with pytest.raises(LaunchSpecError, match=r"minimaxm3_fp4_mi355x_atom.yaml: " + error):
        load_node(recipe)


def test_slurm_options_come_from_the_command_line_over_the_ini(pytester: pytest.Pytester
                                                               ) -> None:
    pytester.makeini("""
        [pytest]
        inferbench_slurm_partition = compute
        inferbench_slurm_time = 500
        inferbench_slurm_exclusive = true
        inferbench_slurm_container = true
        inferbench_slurm_args = --exclude=n09,n11 --cpus-per-task=128
        inferbench_slurm_squash_dir = /var/lib/squash
        inferbench_slurm_container_mounts =
            /it-share/aiperf-cache:/aiperf_mmap_cache
    """)
    config = pytester.parseconfig("--inferbench-slurm-partition=debug",
                                  "--inferbench-slurm-gres=none")
    settings = Settings.from_config(config).slurm
    assert settings == dataclasses.replace(
        SlurmSettings(), partition="debug", time="500", exclusive=True, container=True, gres="",
        args=("--exclude=n09,n11", "--cpus-per-task=128"), squash_dir=Path("/var/lib/squash"),
        container_mounts=("/it-share/aiperf-cache:/aiperf_mmap_cache",))


def test_the_simulated_server_asks_for_no_gres_unless_one_is_named(pytester: pytest.Pytester
                                                                   ) -> None:
    plain = Settings.from_config(pytester.parseconfig()).slurm
    simulated = Settings.from_config(pytester.parseconfig("--inferbench-slurm-sim")).slurm
    named = Settings.from_config(pytester.parseconfig("--inferbench-slurm-sim",
                                                      "--inferbench-slurm-gres=gpu")).slurm
    assert (plain.gres, simulated.gres, named.gres) == ("gpu", "", "gpu")


def test_the_users_comment_is_kept_after_the_owner_tag(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig(
        "--inferbench-slurm-args=--mem=1G --comment 'nightly perf' --exclude n1 --comm=again")
    settings = Settings.from_config(config).slurm
    assert settings.args == ("--mem=1G", "--exclude", "n1")
    assert settings.comment == "nightly perf; again"
    comment = commands.job_comment("host-a:123", "run1", settings.comment)
    assert comment == "inferbench owner=host-a:123 run=run1; nightly perf; again"
    assert commands.comment_owner(comment) == "host-a:123"
    argv = commands.salloc_argv(settings, name="n", comment=comment, nodes=1, gpus_per_node=0)
    assert [w for w in argv if w.startswith("--comm")] == [f"--comment={comment}"]


# (--inferbench-slurm-args, a fragment of its usage error)
HOSTILE_SALLOC_WORDS = [
    ('--comment="nightly', "--inferbench-slurm-args: cannot split into words (No closing "
                           "quotation)"),
    ("--mem=1G 'x", "--inferbench-slurm-args: cannot split into words"),
    ("--job-name=mine", "--job-name=mine: not allowed, the backend names every job"),
    ("-J mine", "-J mine: not allowed, the backend names every job"),
    ("-Jmine", "-Jmine: not allowed"),
    ("--job mine", "--job mine: not allowed"),
    ("--quiet", "--quiet: not allowed, the backend reads each job's id from salloc's messages"),
    ("-Q", "-Q: not allowed"),
    ("-M other", "-M other: not allowed, the job would run on another cluster"),
    ("--clusters=other", "--clusters=other: not allowed"),
    ("--mem=1G --comment", "--comment needs a value"),
]


@pytest.mark.parametrize(("args", "message"), HOSTILE_SALLOC_WORDS,
                         ids=[args for args, _ in HOSTILE_SALLOC_WORDS])
def test_salloc_words_that_cannot_be_used_are_a_usage_error(
        pytester: pytest.Pytester, args: str, message: str) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", f"--inferbench-slurm-args={args}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert message in text, text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


def test_an_unbalanced_quote_in_the_ini_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        inferbench_slurm_args = --exclude=n1 --comment="nightly
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "ini inferbench_slurm_args: cannot split into words (No closing quotation)" in text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text

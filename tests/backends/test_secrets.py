"""HF_TOKEN never appears in any artifact or message: server logs, the terminal, JUnit XML,
point files, summary.json, a saved baseline, the step summary, a failure naming a URL with
credentials. The servers are real programs run by the real backends: the simulator, and a small
HTTP server that does what a careless server does (prints its environment, echoes its token in
error bodies)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lifecycle_helpers import load_node, write_recipe

from pytest_inferbench.backends.process import process_env
from pytest_inferbench.backends.reaper import OWNER_ENV, owner_label
from pytest_inferbench.results.redact import Redactor

TOKEN = "hf_SeCrEt0123456789abcdef"
OTHER_SECRET = "sk-other-0123456789"  # a variable named like a credential, never passed

# A careless server: prints every variable it got, then serves /health and answers every
# completion with an HTTP 500 whose body echoes HF_TOKEN (or dies at start when told to).
LEAKY_SERVER = r'''
import http.server, json, os, sys
print("env:", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())), flush=True)
if os.environ.get("LEAKY_DIE"):
    print("fatal: cannot use token", os.environ.get("HF_TOKEN"), flush=True)
    sys.exit(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": {"message": "token rejected: " + str(
            os.environ.get("HF_TOKEN"))}}).encode()
        self.send_response(500); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def _project(pytester: pytest.Pytester, *, die: bool = False) -> None:
    (pytester.path / "leaky_server.py").write_text(LEAKY_SERVER)
    command = f'"{sys.executable}", "{pytester.path / "leaky_server.py"}", "{{port}}"'
    write_recipe(pytester.path, command=command, timeout=30)
    spec = pytester.path / "launch" / "minimaxm3_fp4_mi355x_atom.yaml"
    # The spec's argv ends in ATOM's words; the leaky server reads only its port.
    text = spec.read_text().replace('args: [python3, -m, atom.entrypoints.openai_server, '
                                    '--model, "{model}", --server-port,\n       "{port}", -tp, '
                                    '"{tp}", --max-model-len, "4096"]', "args: []")
    if die:
        text = text.replace("INFERBENCH_TEST_ENV: visible", "INFERBENCH_TEST_ENV: visible, "
                                                            "LEAKY_DIE: '1'")
    spec.write_text(text)


def _everything(pytester: pytest.Pytester, result: pytest.RunResult) -> dict[str, str]:
    """The run's messages and every file it wrote, by name."""
    texts = {"stdout": result.stdout.str(), "stderr": result.stderr.str()}
    for path in pytester.path.rglob("*"):
        if path.is_file() and path.suffix != ".py":
            texts[str(path.relative_to(pytester.path))] = path.read_text(errors="replace")
    return texts


def _assert_no_token(texts: dict[str, str]) -> None:
    for name, text in texts.items():
        assert TOKEN not in text, f"HF_TOKEN in {name}"
        assert OTHER_SECRET not in text, f"a credential variable in {name}"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("MY_CLOUD_API_KEY", OTHER_SECRET)
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    return summary


SCENARIOS = {
    # name: (die at start, extra options)
    "1-process-default-pass-env-dies-at-start": (True, ()),
    "2-process-pass-env-names-another-variable-dies-at-start": (True, (
        "--inferbench-pass-env", "SOME_OTHER")),
    "3-4-5-6-7-8-error-body-echoes-token-point-json-summary-junit-baseline-step-summary": (
        False, ("--inferbench-pass-env", "HF_TOKEN", "--inferbench-save-baseline", "base.json",
                "--junitxml", "junit.xml")),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_hf_token_never_appears(pytester: pytest.Pytester, secret_env: Path, name: str) -> None:
    die, extra = SCENARIOS[name]
    _project(pytester, die=die)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend", "process", "-k", "conc1",
        "--inferbench-prompts-per-conc", "1", "--junitxml", "junit.xml", *extra)
    texts = _everything(pytester, result)
    if secret_env.exists():
        texts["GITHUB_STEP_SUMMARY"] = secret_env.read_text()
    logs = [n for n in texts if "server-logs" in n]
    assert logs, texts.keys()
    if die:
        result.assert_outcomes(errors=1)
        if "SOME_OTHER" in extra:
            # Not named, so not passed: the server never had the token.
            assert all("HF_TOKEN=" not in texts[n] for n in logs)
            assert "fatal: cannot use token None" in texts["stdout"]
        else:
            assert "fatal: cannot use token ***HF_TOKEN***" in texts["stdout"]
    else:
        result.assert_outcomes(failed=1)
        assert "token rejected: ***HF_TOKEN***" in texts["stdout"]  # the cause, masked
        assert any("token rejected: ***HF_TOKEN***" in t for n, t in texts.items()
                   if n.startswith("inferbench-results/points/"))
        assert "base.json" in texts and "junit.xml" in texts
    # Credential-named host variables never reach a local server.
    assert all("MY_CLOUD_API_KEY" not in texts[n] for n in logs)
    _assert_no_token(texts)


def test_credentials_in_the_base_url_are_masked(pytester: pytest.Pytester,
                                                 secret_env: Path) -> None:
    """Scenarios 9-10: a token in --inferbench-base-url, in the failure message, the JUnit XML
    and the arguments summary.json records."""
    write_recipe(pytester.path)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend", "external", "-k", "conc1",
        "--inferbench-base-url", f"http://user:{TOKEN}@127.0.0.1:9", "--junitxml", "junit.xml")
    result.assert_outcomes(errors=1)
    texts = _everything(pytester, result)
    assert "http://***@127.0.0.1:9" in texts["stdout"]
    assert "summary.json" in " ".join(texts)
    _assert_no_token(texts)


def test_a_local_server_gets_an_allow_list_of_the_host_environment(tmp_path: Path) -> None:
    """Scenario 11: the process, sim-server and slurm backends build the child's environment
    from the allow-list, the pass-env names and the launch spec; a token not named stays out,
    one named is passed, and the run's redactor masks both whatever pass-env says."""
    _, spec = load_node(write_recipe(tmp_path))
    host = {"PATH": "/usr/bin", "HOME": "/root", "HF_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY":
            OTHER_SECRET, "CUDA_VISIBLE_DEVICES": "0", "RANDOM_APP_SETTING": "x"}
    env = process_env(spec, (), host)
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0",
                   **spec.env_dict, OWNER_ENV: owner_label()}
    assert process_env(spec, ("HF_TOKEN",), host)["HF_TOKEN"] == TOKEN
    redactor = Redactor.from_env(("SOME_OTHER",), host)
    assert redactor.text(f"{TOKEN} {OTHER_SECRET}") == (
        "***HF_TOKEN*** ***AWS_SECRET_ACCESS_KEY***")

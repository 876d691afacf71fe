"""`perf-changelog.yaml` checks (InferenceX format, inferencex-formats.md §7).

For the collection code: `load_changelog(path) -> Changelog` (entries with their lines, plus
file-level problems), `known_config_keys(directory, globs)` and `check_entry(entry,
known_keys, pr_number, added) -> list[str]`; `gate.py` compares the file with a base revision.
Each entry becomes one item; file-level problems belong to the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..util.yamllines import YamlSyntaxError, compose, load_data

PR_URL = re.compile(r"https://github\.com/SemiAnalysisAI/InferenceX/pull/(\d+)")
# A link to a PR's page, one of its tabs included (`.../pull/2305/changes`): what an added entry
# may name. InferenceX's sweep validator accepts any such link; its stricter canonical form is
# required of history corrections only (`history`), as there.
PR_PAGE_URL = re.compile(r"https://github\.com/SemiAnalysisAI/InferenceX/pull/(\d+)(?:/[a-z-]+)?")
PLACEHOLDERS = ("XXX", "https://github.com/SemiAnalysisAI/InferenceX/pull/XXX")
FIELDS = (
    "config-keys",
    "description",
    "pr-link",
    "evals-only",
    "all-evals",
    "scenario-type",
    "append-only",
    "eval-min-prefill-ep",
)
FLAGS = ("evals-only", "all-evals", "append-only")  # true/false fields
SCENARIO_TYPES = ("fixed-seq-len", "agentic-coding")
BOOL_TAG, INT_TAG, NULL_TAG = (f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "null"))


class ChangelogError(Exception):
    """The changelog or its git base cannot be read at all; the message says why."""


@dataclass(frozen=True)
class ChangelogEntry:
    index: int  # 0-based position in the file
    line: int  # 1-based line of the entry's "- config-keys:"
    config_keys: tuple[str, ...]
    description: tuple[str, ...]
    pr_link: str
    problems: tuple[str, ...] = ()  # schema problems found while parsing
    scenario_types: tuple[str, ...] = ()  # `scenario-type`: the scenarios it reruns; () all

    @property
    def identity(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.config_keys, self.description


@dataclass(frozen=True)
class Changelog:
    path: Path
    entries: tuple[ChangelogEntry, ...]
    problems: tuple[str, ...]  # file-level: trailing newline, tabs, CR, root type


def _strings(node: yaml.Node | None) -> tuple[tuple[str, ...], bool]:
    if isinstance(node, yaml.SequenceNode) and all(
        isinstance(n, yaml.ScalarNode) for n in node.value
    ):
        return tuple(str(n.value) for n in node.value), True
    return (), False


def parse_changelog(text: str, path: Path) -> Changelog:
    problems: list[str] = []
    if text and not text.endswith("\n"):
        problems.append(f"{path}: the file must end with a newline")
    for char, name in (("\r", "carriage returns"), ("\t", "tabs"), ("\0", "NUL bytes")):
        if char in text:
            line = text[: text.index(char)].count("\n") + 1
            problems.append(f"{path}:{line}: {name} are not allowed")
    try:
        root = compose(text)
    except YamlSyntaxError as exc:
        raise ChangelogError(f"{path}:{exc.line}: invalid YAML: {exc.problem}") from None
    if root is None:
        return Changelog(path, (), tuple(problems))
    if not isinstance(root, yaml.SequenceNode):
        problems.append(f"{path}:1: the changelog must be a list of entries")
        return Changelog(path, (), tuple(problems))
    entries = tuple(_entry(i, node, path) for i, node in enumerate(root.value))
    return Changelog(path, entries, tuple(problems))


def _entry(index: int, node: yaml.Node, path: Path) -> ChangelogEntry:
    line = node.start_mark.line + 1
    where = f"{path}:{line}"
    if not isinstance(node, yaml.MappingNode):
        return ChangelogEntry(index, line, (), (), "", (f"{where}: an entry must be a mapping",))
    problems: list[str] = []
    fields: dict[str, yaml.Node] = {}
    for key_node, value in node.value:
        key = str(key_node.value)
        if key in fields:
            problems.append(f"{path}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
        elif key not in FIELDS:
            problems.append(f"{path}:{key_node.start_mark.line + 1}: unknown field {key!r}")
        fields[key] = value
    keys, ok = _strings(fields.get("config-keys"))
    if not ok or not keys:
        problems.append(f"{where}: config-keys must be a non-empty list of config keys")
    description, ok = _strings(fields.get("description"))
    if not ok or not any(d.strip() for d in description):
        problems.append(f"{where}: description must be a non-empty list of lines")
    link_node = fields.get("pr-link")
    link = str(link_node.value) if isinstance(link_node, yaml.ScalarNode) else ""
    if not link:
        problems.append(f"{where}: pr-link is missing")
    problems += _option_problems(fields, where)
    scenarios = _strings(fields.get("scenario-type"))[0]
    return ChangelogEntry(index, line, keys, description, link, tuple(problems), scenarios)


def _scalar(node: yaml.Node | None, tag: str) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == tag


def _option_problems(fields: dict[str, yaml.Node], where: str) -> list[str]:
    """The optional fields, typed as InferenceX's `ChangelogEntry` types them."""
    problems = [f"{where}: {name} must be true or false" for name in FLAGS
                if name in fields and not _scalar(fields[name], BOOL_TAG)]
    min_ep = fields.get("eval-min-prefill-ep")
    if min_ep is not None and not _scalar(min_ep, NULL_TAG) and not (
            _scalar(min_ep, INT_TAG) and _int(min_ep) >= 1):
        problems.append(f"{where}: eval-min-prefill-ep must be a whole number of at least 1")
    scenarios = fields.get("scenario-type")
    if scenarios is not None and not _scalar(scenarios, NULL_TAG):
        names, ok = _strings(scenarios)
        if not ok or not names or not set(names) <= set(SCENARIO_TYPES):
            problems.append(f"{where}: scenario-type must be a non-empty list of "
                            + " / ".join(SCENARIO_TYPES))
    # An append-only entry adds throughput points to a curve; InferenceX refuses it any eval
    # selection, since there is no earlier eval result to append to.
    if _true(fields.get("append-only")) and (
            any(_true(fields.get(name)) for name in ("evals-only", "all-evals"))
            or (min_ep is not None and not _scalar(min_ep, NULL_TAG))):
        problems.append(f"{where}: append-only cannot be combined with evals-only, all-evals "
                        "or eval-min-prefill-ep")
    return problems


def _true(node: yaml.Node | None) -> bool:
    return (isinstance(node, yaml.ScalarNode) and node.tag == BOOL_TAG
            and str(node.value).lower() in ("true", "yes", "on"))


def _int(node: yaml.Node) -> int:
    try:
        return int(yaml.safe_load(str(node.value)))
    except (TypeError, ValueError):
        return 0


def load_changelog(path: Path) -> Changelog:
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChangelogError(f"{path}: cannot read as UTF-8: {exc}") from None
    return parse_changelog(text, path)


def known_config_keys(directory: Path, globs: tuple[str, ...] = ("*-master.yaml",)) -> set[str]:
    """Top-level keys of the master configs in `directory`."""
    keys: set[str] = set()
    for pattern in globs:
        for master in sorted(directory.glob(pattern)):
            data = load_data(master.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                keys.update(str(k) for k in data)
    return keys


def key_matches(pattern: str, key: str) -> bool:
    """Whether a changelog's config key names a config: `*` stands for any run of characters,
    every other character for itself (InferenceX resolves keys so, `?` and `[` included)."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), key) is not None


def check_entry(
    entry: ChangelogEntry, known_keys: set[str], pr_number: int | None, added: bool
) -> list[str]:
    """Everything wrong with one entry, one line each. Only entries the branch added are held
    to live config keys and to a link of a PR (PR N with `--inferbench-pr N`), as
    InferenceX's validator holds only the lines a change adds: history is never re-judged."""
    where = f"entry at line {entry.line}"
    failures = list(entry.problems)
    if not added:
        return failures
    for key in entry.config_keys:
        if "*" in key:
            if not any(key_matches(key, k) for k in known_keys):
                failures.append(
                    f"{where}: no config keys matched the wildcard pattern "
                    f"{key!r} in master configs"
                )
        elif key not in known_keys:
            failures.append(f"{where}: config key {key!r} not found in master configs")
    link = entry.pr_link
    found = PR_PAGE_URL.fullmatch(link)
    if link and not found and link not in PLACEHOLDERS:
        failures.append(
            f"{where}: pr-link {link!r} is not a link to a PR "
            "(https://github.com/SemiAnalysisAI/InferenceX/pull/N) or XXX"
        )
    if pr_number is not None and found and int(found.group(1)) != pr_number:
        failures.append(
            f"{where}: new entry links PR {found.group(1)}, but it is added by "
            f"PR {pr_number}: use .../pull/{pr_number} or XXX"
        )
    return failures

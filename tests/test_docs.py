"""The documentation holds: every link of the README and of every page of the site resolves (files,
headings, the references generated at build time), every code block is run or checked by a test,
the Quick start runs as written, and the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import inspect
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import tomllib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import yaml
from markdown.extensions.toc import slugify

import pgworker
import pgworker.sync
import pgworker.testing
from pgworker._runtime import health_file as _health_file
from pgworker.cli import build_parser

from .docs import DOCS, README, ROOT, Block, all_blocks, blocks, rendered
from .helpers import wait_for

on_the_loop = pytest.mark.asyncio(loop_scope="session")

# The first 16 hex digits of the SHA-256 of the package registries' host names: a link to one is
# refused without this file naming any.
REGISTRY_HOSTS = {
    "a4aa2ac280bb8d1a",
    "c899567ee9068517",
    "9495278a74715c7e",
    "0dc11026ac75c015",
    "5cd04dc6512f5c57",
    "3ca29e55be4befa4",
    "e680c440a2e92079",
    "1ba4e37997a2e986",
    "c2b35955576ffa71",
    "00a7dc5a0cc38858",
    "9da5f32d96412512",
    "789e46d79514e280",
    "eb7e11c7f9ecbcf4",
    "3d01f3609be82d98",
    "70bb4000cd2fab03",
}
DOCS_DIR = ROOT / "docs"
FILE_NAMED = re.compile(r"(?:#|--) (examples/\S+)")


# Links


def anchors(path: Path) -> set[str]:
    """The ids of a page's headings, as the site (Python-Markdown's toc) and GitHub make them."""
    text = re.sub(r"^```.*?^```", "", rendered(path), flags=re.S | re.M)
    return {slugify(h, "-") for h in re.findall(r"^#+ (.+?)\s*$", text, re.M)}


def links(text: str) -> list[str]:
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)


def test_every_link_of_the_readme_and_the_site_resolves():
    checked = 0
    for doc in DOCS:
        in_site = DOCS_DIR in doc.parents
        for target in links(rendered(doc)):
            where = f"{doc.relative_to(ROOT)}: link to {target}"
            if re.match(r"[a-z]+:", target):
                url = urlsplit(target)
                assert url.scheme == "https" or url.scheme == "http", where
                assert url.hostname and "." in url.hostname, where
                digest = hashlib.sha256(url.hostname.encode()).hexdigest()[:16]
                assert digest not in REGISTRY_HOSTS, f"{where}: a package registry"
                continue
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            assert path.exists(), f"{where} (no such file)"
            if in_site:  # the site serves docs/ only
                assert DOCS_DIR in path.parents, f"{where} (outside docs/: not in the site)"
            if anchor:
                assert anchor in anchors(path), f"{where} (no such heading)"
            checked += 1
    assert checked > 100


# Code blocks: each is a file's text (and the file is run by a test), or checked by its kind.


def test_every_code_block_is_run_or_checked():
    unchecked = []
    kinds: dict[str, int] = {}
    for block in all_blocks():
        kind = check(block)
        if kind is None:
            unchecked.append(str(block))
        else:
            kinds[kind] = kinds.get(kind, 0) + 1
    assert not unchecked, f"no test runs or checks the blocks at {unchecked}"
    assert kinds.keys() >= {"file", "python", "sh", "sql", "yaml", "dockerfile", "mermaid"}, kinds


def check(block: Block) -> str | None:
    """Checks `block` by its kind and says which, or None when no rule covers it."""
    named = FILE_NAMED.fullmatch(block.first_line)
    if named:
        return check_file(block, named[1])
    checker = CHECKERS.get(block.language)
    if checker is None:
        return None
    return checker(block)


def check_file(block: Block, name: str) -> str:
    path = ROOT / name
    assert path.is_file(), f"{block}: no file {name}"
    assert block.rest.strip() in path.read_text(), f"{block} differs from {name}"
    module = name.removesuffix(".py").replace("/", ".")
    said = {name, module, Path(name).name, str(Path(name).parent)}  # a suite runs its directory
    tests = [p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_docs.py"]
    assert any(s in t for s in said for t in tests), f"{name}: run by no test"
    return "file"


def check_python(block: Block) -> str:
    source = block.body
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST
    tree = compile(source, str(block), "exec", flags=flags, dont_inherit=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = dotted(node)
            if chain and chain[0] == "pgworker":
                resolve(block, chain)
            elif chain and chain[0] == "ctx" and len(chain) == 2:
                assert hasattr(pgworker.JobContext, chain[1]), f"{block}: no ctx.{chain[1]}"
        if isinstance(node, ast.Call):
            chain = dotted(node.func)
            target: Any = None
            if chain and chain[0] == "pgworker":
                target = resolve(block, chain)
            elif chain == ["registry", "task"]:
                target = pgworker.Registry.task
            if callable(target) and node.keywords:
                keywords = {k.arg: None for k in node.keywords if k.arg is not None}
                signature = inspect.signature(target)
                if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
                    unknown = set(keywords) - set(signature.parameters)
                    assert not unknown, f"{block}: {'.'.join(chain)} takes no {unknown}"
    return "python"


def dotted(node: ast.expr) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(names)]
    return None


def resolve(block: Block, chain: list[str]) -> Any:
    found: Any = pgworker
    for name in chain[1:]:
        assert hasattr(found, name), f"{block}: {'.'.join(chain)} does not exist"
        found = getattr(found, name)
    return found


def logical_lines(body: str) -> list[str]:
    return [line for line in body.replace("\\\n", " ").splitlines() if line.strip()]


def parses(block: Block, argv: list[str]) -> None:
    """`pgworker ARGV` is a command line the parser takes."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 0, f"{block}: pgworker {shlex.join(argv)}: {err.getvalue()}"


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def check_sh(block: Block) -> str:
    syntax = subprocess.run(["bash", "-n"], input=block.body, text=True, capture_output=True)
    assert syntax.returncode == 0, f"{block}: {syntax.stderr}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in logical_lines(block.body):
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if not words:
            continue
        command, args = words[0], words[1:]
        if command == "pgworker":
            parses(block, args)
        elif command == "make":
            assert set(args) <= makefile_targets(), f"{block}: make {args}"
        elif command == "python" and args[:3] == ["-m", "pip", "install"]:
            for target in args[3:]:
                name, _, extras = target.partition("[")
                assert name in (project["name"], "."), f"{block}: installs {target}"
                wanted = set(filter(None, extras.rstrip("]").split(",")))
                assert wanted <= set(project["optional-dependencies"]), f"{block}: {target}"
        elif command == "python":
            assert (ROOT / args[0]).is_file(), f"{block}: no {args[0]}"
        elif command == "docker":
            assert args[0] in ("build", "run", "compose"), f"{block}: docker {args[0]}"
            if args[0] == "run":
                image = next(i for i, a in enumerate(args) if a == "pgworker-queue")
                parses(block, args[image + 1 :])
        elif command != "export":
            raise AssertionError(f"{block}: no rule checks `{command}`")
    return "sh"


def check_yaml(block: Block) -> str:
    content = yaml.safe_load(block.body)
    for container in content.get("spec", {}).get("containers", []):
        parses(block, container["args"])
        probe = container.get("livenessProbe", {}).get("exec", {}).get("command", [])
        if probe:
            assert probe[0] == "pgworker", f"{block}: {probe}"
            parses(block, probe[1:])
    return "yaml"


def check_dockerfile(block: Block) -> str:
    for line in logical_lines(block.body):
        instruction, _, rest = line.partition(" ")
        assert instruction in ("FROM", "COPY", "CMD", "RUN", "ENV", "USER"), f"{block}: {line}"
        if instruction == "CMD":
            parses(block, json.loads(rest))
    return "dockerfile"


def check_mermaid(block: Block) -> str:
    kind = block.first_line.split()[0]
    assert kind in ("flowchart", "graph", "stateDiagram-v2", "sequenceDiagram"), f"{block}: {kind}"
    if kind == "stateDiagram-v2":
        states = set(re.findall(r"^\s*(\S+) --> (\S+?):?(?:\s|$)", block.body, re.M))
        named = {s for pair in states for s in pair} - {"[*]"}
        assert named == {s.value for s in pgworker.JobStatus}, f"{block}: {named}"
    return "mermaid"


def check_text(block: Block) -> str | None:
    """The only output shown as text: `pgworker health`'s unhealthy lines, each produced here."""
    if not block.body.startswith("pgworker health: unhealthy: "):
        return None
    lines = block.body.strip().splitlines()
    path = "/tmp/pgworker-health.json"
    produced = [health_line(path, case) for case in ("missing", "stale", "stopped", "unreadable")]
    assert lines == produced, f"{block}: {produced}"
    return "text"


def health_line(path: str, case: str) -> str:
    """What `pgworker health --health-file PATH` prints when the file at PATH is `case`."""
    with tempfile.TemporaryDirectory() as directory:
        written = os.path.join(directory, "health.json")
        now = None
        if case == "unreadable":
            Path(written).write_text("")
        elif case != "missing":
            state = "stopped" if case == "stopped" else "ok"
            content = _health_file.record(
                "w1", 30.0, {"producer": {"state": state}}, stopping=case == "stopped"
            )
            _health_file.write(written, content)
            if case == "stale":
                now = datetime.fromisoformat(content["written_at"]) + timedelta(seconds=42)
        reason = _health_file.judge(written, now=now).reason
    return "pgworker health: unhealthy: " + reason.replace(written, path)


CHECKERS = {
    "python": check_python,
    "sh": check_sh,
    "yaml": check_yaml,
    "dockerfile": check_dockerfile,
    "mermaid": check_mermaid,
    "text": check_text,
    "sql": lambda block: "sql",  # run by test_every_sql_block_runs
}


async def run_sql_block(conn: Any, body: str) -> None:
    """Run `body` in the caller's transaction. An index a migration makes, which a block builds
    CONCURRENTLY beforehand (which no transaction allows), is dropped and built by the block
    without CONCURRENTLY, and must come out as the migration made it."""
    built = re.search(r"CREATE INDEX CONCURRENTLY (\w+)", body)
    if built is None:
        await conn.execute(body)
        return
    definition = "SELECT pg_get_indexdef(to_regclass('pgworker.' || $1))"
    migrated = await conn.fetchval(definition, built.group(1))
    assert migrated is not None, f"no migration makes the index {built.group(1)}"
    await conn.execute(f"DROP INDEX pgworker.{built.group(1)}")
    await conn.execute(body.replace(" CONCURRENTLY", ""))
    assert await conn.fetchval(definition, built.group(1)) == migrated


@on_the_loop
async def test_every_sql_block_runs(conn):
    """Each SQL block that names no file runs on a migrated database (rolled back after)."""
    ran = 0
    for block in all_blocks():
        if block.language != "sql" or FILE_NAMED.fullmatch(block.first_line):
            continue
        transaction = conn.transaction()
        await transaction.start()
        try:
            await run_sql_block(conn, block.body)
        except Exception as exc:
            raise AssertionError(f"{block}: {exc}") from exc
        finally:
            await transaction.rollback()
        ran += 1
    assert ran >= 3


def test_a_block_no_rule_covers_is_found():
    """The checker itself: a block of an unknown kind, or that names a file it is not, fails."""
    doc = ROOT / "docs" / "scaling.md"
    assert check(Block(doc, 1, "ruby", "puts 1")) is None
    with pytest.raises(AssertionError, match="differs"):
        check(Block(doc, 1, "python", "# examples/recipes/retry.py\nnot the recipe"))
    with pytest.raises(AssertionError, match="no rule checks"):
        check(Block(doc, 1, "sh", "curl https://example.org"))
    with pytest.raises(AssertionError, match="pgworker run"):
        check(Block(doc, 1, "sh", "pgworker run app.handlers --no-such-option"))
    with pytest.raises(AssertionError, match="takes no"):
        check(Block(doc, 1, "python", "await pgworker.enqueue(conn, 't', {}, priorty=1)"))


# The Quick start, as written


def quick_start() -> list[Block]:
    text = README.read_text()
    start = text.index("## Quick start")
    return [b for b in blocks(README) if start < text.index(b.body)][:4]


@on_the_loop
async def test_the_quick_start_runs_as_written(dsn, conn, tmp_path):
    """The README's Quick start in a fresh directory: migrate, the handlers module, an enqueue
    through the task's handle inside a transaction (the task's priority and retries applied),
    and `pgworker run` serving it until SIGTERM."""
    migrate, handlers, enqueue, run = quick_start()
    assert handlers.first_line == "# app/handlers.py"
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "handlers.py").write_text(handlers.rest)
    await conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, state text)")
    await conn.execute("INSERT INTO invoices VALUES (42, 'new')")
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    script = migrate.body.replace("postgresql://app@db/app", shlex.quote(dsn))
    done = await anyio.run_process(["bash", "-euc", script], env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr.decode()

    runner = tmp_path / "enqueue.py"
    runner.write_text(
        "import asyncio, ast, sys, asyncpg\n"
        "async def main():\n"
        "    async with asyncpg.create_pool(sys.argv[1]) as pool:\n"
        f"        code = compile({enqueue.body!r}, 'quick start', 'exec',"
        " flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
        "        scope = {'pool': pool}\n"
        "        await eval(code, scope)\n"
        "        print(scope['result'].job.id)\n"
        "asyncio.run(main())\n"
    )
    done = await anyio.run_process(
        [sys.executable, str(runner), dsn], env=env, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    job_id = int(done.stdout.decode())
    row = await conn.fetchrow(
        "SELECT priority, max_retries, status FROM pgworker.jobs WHERE id = $1", job_id
    )
    assert (row["priority"], row["max_retries"], row["status"]) == (20, 5, "pending")
    assert await conn.fetchval("SELECT state FROM invoices WHERE id = 42") == "sending"

    words = shlex.split(run.body, comments=True)
    assert words[:2] == ["pgworker", "run"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgworker", *words[1:], "--dsn", dsn],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job_id
            ),
            timeout=30,
        )
        worker.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30)) == 0
    finally:
        worker.kill()
        worker.wait()
    job = await pgworker.get_job(conn, job_id)
    assert job is not None and job.result == {"sent": True}


# The site


def test_the_site_builds_strict_with_the_generated_references(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a missing page or a docstring mkdocstrings
    cannot read fails it. The CLI page holds every command, the HTTP API page every operation."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for name in commands(build_parser()):
        assert f'id="pgworker-{name.replace(" ", "-")}"' in cli, name
    api = (tmp_path / "site" / "http-api" / "index.html").read_text()
    assert "POST /jobs/{id}/heartbeat" in api and "GET /workers" in api
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("enqueue.enqueue", "enqueue_many", "Worker", "RetryPolicy", "JobStatus"):
        assert f'id="pgworker.{name}"' in reference, name


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [f"{prefix}{name}", *commands(sub, f"{prefix}{name} ")]
    return found


# --- the demo --------------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_the_demo_checks_what_it_shows(dsn):
    """`make run` exits non-zero when a job of the demo ends otherwise than the README says."""
    out = subprocess.run(
        [sys.executable, "examples/demo.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PGWORKER_DSN": dsn, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every job ended as expected" in out.stdout

"""The package as users get it: `python -m build` makes a wheel and an sdist named after the
distribution (pgworker-queue), each installed in a fresh virtualenv with its dependencies from the
package index runs `pgworker migrate` and a job through `pgworker run`, and ships `py.typed`.
The Dockerfile: linted by hadolint, its instructions checked, and its RUN steps' commands run in
fresh virtualenvs; the compose example's worker command run outside Docker.

The tests that build, install or run the package are marked `slow` (a few minutes). `make test`
runs them; `pytest -m 'not slow'` leaves them out, and keeps the checks of what a team adopting
the package reads first: its licence, changelog, URLs and classifiers."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import trove_classifiers
import yaml

import pgworker
from pgworker._version import DISTRIBUTION

from .docs import all_blocks
from .helpers import ROOT, has_status, wait_for

slow = pytest.mark.slow
aio = pytest.mark.asyncio(loop_scope="session")

STEM = DISTRIBUTION.replace("-", "_")
VERSION = pgworker.__version__
HANDLERS = """
import pgworker

registry = pgworker.Registry()


@registry.task("greet")
async def greet(ctx: pgworker.JobContext, payload: dict) -> dict:
    return {"hello": payload["name"], "attempt": ctx.attempt}
"""


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def run(*args: str | Path, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout on the path and without a database set."""
    drop = ("PYTHONPATH", "PGWORKER_DSN", "DATABASE_URL", "PGWORKER_HEALTH_FILE", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | extra


def fresh_venv(where: Path) -> Path:
    """A new virtualenv from this Python, without this checkout's packages; its bin directory."""
    run(sys.executable, "-m", "venv", where, env=clean_env())
    return where / "bin"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    [wheel] = out.glob("*.whl")
    [sdist] = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@slow
def test_the_wheel_and_the_sdist_carry_the_distribution_name_the_sql_and_py_typed(built):
    wheel, sdist = built["wheel"], built["sdist"]
    assert wheel.name == f"{STEM}-{VERSION}-py3-none-any.whl"
    assert sdist.name == f"{STEM}-{VERSION}.tar.gz"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"{STEM}-{VERSION}.dist-info/METADATA").decode()
        entry_points = z.read(f"{STEM}-{VERSION}.dist-info/entry_points.txt").decode()
    assert {"pgworker/py.typed", "pgworker/__init__.py", "pgworker/sql/queries/job_claim.sql"} <= (
        names
    )
    assert f"Name: {DISTRIBUTION}\n" in metadata
    assert "pgworker = pgworker.cli:main" in entry_points
    assert f"{STEM}-{VERSION}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT\n" in metadata and "License-File: LICENSE\n" in metadata
    project = pyproject()["project"]
    for label, url in project["urls"].items():
        assert f"Project-URL: {label}, {url}\n" in metadata
    for classifier in project["classifiers"]:
        assert f"Classifier: {classifier}\n" in metadata
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    assert {"pgworker/py.typed", "pyproject.toml", "README.md", "sql/queries/job_claim.sql"} <= (
        members
    )
    assert {"LICENSE", "CHANGELOG.md"} <= members


@slow
@aio
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
async def test_installed_in_a_fresh_venv_it_migrates_and_runs_a_job(
    built, kind, empty_dsn, tmp_path
):
    import asyncpg

    bin_ = fresh_venv(tmp_path / "venv")
    run(bin_ / "pip", "install", "--quiet", built[kind], env=clean_env(), cwd=tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "tinyapp.py").write_text(HANDLERS)
    env = clean_env(PGWORKER_DSN=empty_dsn)

    where = run(
        bin_ / "python",
        "-c",
        "import importlib.metadata as m, pathlib, pgworker; "
        f"print(m.version({DISTRIBUTION!r})); "
        "print(pathlib.Path(pgworker.__file__).parent)",
        env=env,
        cwd=app,
    ).stdout.split()
    assert where[0] == VERSION
    package = Path(where[1])
    assert package.is_relative_to(tmp_path / "venv"), package
    assert (package / "py.typed").is_file()

    assert "applied migrations [1, " in run(bin_ / "pgworker", "migrate", env=env, cwd=app).stdout
    enqueued = run(
        bin_ / "pgworker", "enqueue", "greet", "--payload", '{"name": "venv"}', env=env, cwd=app
    )
    job_id = json.loads(enqueued.stdout)["id"]
    health_file = tmp_path / "health.json"
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [str(bin_ / "pgworker"), "run", "tinyapp", "--health-file", str(health_file)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
        cwd=app,
    )
    conn = await asyncpg.connect(empty_dsn)
    try:
        await wait_for(lambda: has_status(conn, job_id, "completed"), timeout=60)
        result = await conn.fetchval("SELECT result FROM pgworker.jobs WHERE id = $1", job_id)
        assert json.loads(result) == {"hello": "venv", "attempt": 1}
        probe = subprocess.run(
            [str(bin_ / "pgworker"), "health", "--health-file", str(health_file)],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
        assert probe.returncode == 0, probe.stderr
    finally:
        await conn.close()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, log.read_text()


# --- the Dockerfile -------------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        ),
    )
    found = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


@slow
def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@slow
def test_the_image_runs_pgworker_as_a_user_and_probes_its_health_file():
    build, final = stages(ROOT / "Dockerfile")
    for stage in (build, final):
        assert re.fullmatch(r"python:3\.1[1-9]-slim( AS \w+)?", stage[0][1]), stage[0]
    assert final[0][1] == "python:3.12-slim"  # as the README says
    found = dict(final)
    assert found["USER"] == "10001:10001" and found["WORKDIR"] == "/app"
    assert "--uid 10001 " in found["RUN"]  # the last RUN: the user made
    assert json.loads(found["ENTRYPOINT"]) == ["pgworker"]
    assert found["STOPSIGNAL"] == "SIGTERM"
    options, _, command = found["HEALTHCHECK"].partition(" CMD ")
    env = dict(re.findall(r"(\w+)=(\S+)", found["ENV"]))
    assert json.loads(command) == [
        "pgworker",
        "health",
        "--health-file",
        env["PGWORKER_HEALTH_FILE"],
    ]
    assert "--start-period=" in options
    assert env["PGWORKER_HEALTH_FILE"].startswith("/tmp/")  # writable by the user


@slow
def test_the_dockerfile_run_steps_build_and_install_the_entrypoint(tmp_path):
    """The build stage's COPY and RUN, then the final stage's pip RUN (EXTRAS=metrics,otel), run
    here with /wheels under tmp_path and each stage's `pip` from a fresh virtualenv: the wheel
    builds from just what is copied, installs with the extra, and `pgworker` (the ENTRYPOINT)
    runs and answers the HEALTHCHECK's command."""
    build, final = stages(ROOT / "Dockerfile")
    wheels = tmp_path / "wheels"

    def here(command: str) -> str:
        return command.replace("/wheels", str(wheels))

    src = tmp_path / "src"
    src.mkdir()
    for word, args in build:
        if word == "COPY":
            *sources, target = shlex.split(args)
            for source in sources:
                dest = (src / target / Path(source).name) if target.endswith("/") else src / target
                origin = ROOT / source
                if origin.is_dir():
                    shutil.copytree(
                        origin, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy(origin, dest)
    runs = [args for word, args in build if word == "RUN"]
    assert len(runs) == 1
    bin_ = fresh_venv(tmp_path / "build-venv")
    env = clean_env(PATH=f"{bin_}:{os.environ['PATH']}")
    run("sh", "-ec", here(runs[0]), cwd=src, env=env)
    assert [w.name for w in wheels.glob("*.whl")] == [f"{STEM}-{VERSION}-py3-none-any.whl"]

    installs = [args for word, args in final if word == "RUN" and "pip install" in args]
    assert len(installs) == 1
    bin_ = fresh_venv(tmp_path / "image-venv")
    env = clean_env(PATH=f"{bin_}:{os.environ['PATH']}", EXTRAS="metrics,otel")
    run("sh", "-ec", here(installs[0]), cwd=tmp_path, env=env)
    assert not wheels.exists()  # removed in the same step: not left in a layer
    assert (bin_ / "pgworker").is_file()
    run(bin_ / "python", "-c", "import prometheus_client, opentelemetry", env=clean_env())
    version = run(bin_ / "pgworker", "--version", env=clean_env(), cwd=tmp_path)
    assert version.stdout.strip() == f"pgworker {VERSION}"
    probe = subprocess.run(
        [str(bin_ / "pgworker"), "health", "--health-file", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert probe.returncode == 1 and "no health file at" in probe.stderr


# --- the compose example ------------------------------------------------------------------------


@slow
@aio
async def test_the_compose_example_migrates_once_then_runs_two_workers(dsn, conn, tmp_path):
    """What compose.yaml asks of the image, outside Docker: its migrate command, then its worker
    command twice, run in the directory its volume mounts at /app."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert services["db"]["image"].startswith("postgres:")
    migrate, worker = services["migrate"], services["worker"]
    assert migrate["command"] == ["migrate"] and migrate["restart"] == "no"
    assert worker["deploy"]["replicas"] == 2
    assert worker["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    [volume] = worker["volumes"]
    source, mounted, _ = volume.split(":")
    assert mounted.startswith("/app/")  # the image's WORKDIR
    assert Path(mounted).parent == Path("/app")
    cwd = tmp_path / "app"
    cwd.mkdir()
    (cwd / Path(mounted).name).symlink_to(ROOT / source)

    env = clean_env(PGWORKER_DSN=dsn, PYTHONPATH=str(ROOT))  # this checkout's pgworker
    run(sys.executable, "-m", "pgworker", *migrate["command"], env=env, cwd=cwd)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "pgworker", *worker["command"]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        for _ in range(worker["deploy"]["replicas"])
    ]
    try:
        jobs = await pgworker.enqueue_many(
            conn, [pgworker.JobSpec("send-invoice", {"invoice_id": n}) for n in range(20)]
        )
        for r in jobs:
            await wait_for(lambda r=r: has_status(conn, r.job.id, "completed"), timeout=60)
        await wait_for(lambda: conn.fetchval("SELECT count(*) = 2 FROM pgworker.workers"))
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in workers]
    assert codes == [0, 0]


# --- the README -----------------------------------------------------------------------------------


def doc_blocks(language: str) -> list[str]:
    return [b.body for b in all_blocks() if b.language == language]


@slow
def test_every_install_line_of_the_readme_names_the_distribution_and_real_extras():
    project = pyproject()["project"]
    assert project["name"] == DISTRIBUTION
    extras = set(project["optional-dependencies"])
    text = (ROOT / "README.md").read_text()
    installs = re.findall(r"pip install ([^\s`]+)", text)
    assert len(installs) >= 3, installs
    for target in installs:
        target = target.strip("'\"")
        name, _, listed = target.partition("[")
        assert name in (DISTRIBUTION, "."), target  # "." is a checkout of this repository
        assert set(filter(None, listed.rstrip("]").split(","))) <= extras, target
    assert f"Installed as `{DISTRIBUTION}`, imported and run as `pgworker`" in text


@slow
def test_the_docs_kubernetes_probe_is_the_image_healthcheck_and_outlasts_a_graceful_stop():
    [pod] = [yaml.safe_load(b) for b in doc_blocks("yaml") if "livenessProbe" in b]
    [container] = pod["spec"]["containers"]
    probe = container["livenessProbe"]
    healthcheck = dict(stages(ROOT / "Dockerfile")[-1])["HEALTHCHECK"]
    assert probe["exec"]["command"] == json.loads(healthcheck.partition(" CMD ")[2])
    shutdown_timeout = pgworker.Settings(dsn="x").shutdown_timeout
    assert pod["spec"]["terminationGracePeriodSeconds"] > shutdown_timeout
    assert probe["periodSeconds"] * probe["failureThreshold"] > shutdown_timeout
    [mount] = container["volumeMounts"]
    health_file = probe["exec"]["command"][-1]
    assert Path(health_file).parent == Path(mount["mountPath"])
    assert container["args"][0] == "run"


# --- what a team adopting the package reads first (not slow) --------------------------------------

REPOSITORY = "https://github.com/pgworker/pgworker"
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_licence_is_the_declared_mit_and_ships_in_the_sdist_and_the_wheel_metadata():
    config = pyproject()
    assert config["project"]["license"] == "MIT"
    assert config["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the pgworker authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    sdist = config["tool"]["hatch"]["build"]["targets"]["sdist"]["only-include"]
    assert {"LICENSE", "CHANGELOG.md"} <= set(sdist)


def test_the_metadata_names_the_repository_and_real_classifiers():
    project = pyproject()["project"]
    urls = project["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert urls["Repository"] == REPOSITORY
    assert all(url.startswith(REPOSITORY + "/") or url == REPOSITORY for url in urls.values())
    assert urls["Changelog"].endswith("/CHANGELOG.md")
    classifiers = project["classifiers"]
    assert not set(classifiers) - trove_classifiers.classifiers, "unknown classifiers"
    assert len(set(classifiers)) == len(classifiers)
    assert {
        "Framework :: AsyncIO",
        "Topic :: Database",
        "Typing :: Typed",
        "Programming Language :: Python :: 3 :: Only",
    } <= set(classifiers)
    assert [c for c in classifiers if c.startswith("Development Status ::")]
    assert not [c for c in classifiers if c.startswith("License ::")], "license says it (PEP 639)"
    pythons = [c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".* :: 3\.\d+", c)]
    assert pythons[0] == project["requires-python"].removeprefix(">=")
    assert "postgresql" in project["keywords"]


def changelog_releases() -> list[tuple[str, str]]:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\S+))?$", text, re.M)
    assert headings and headings[0] == ("Unreleased", ""), "the first section is [Unreleased]"
    assert set(re.findall(r"^### (.+)$", text, re.M)) <= SECTIONS
    return headings[1:]


def test_the_changelog_latest_release_is_the_package_version():
    releases = changelog_releases()
    assert releases[0][0] == pyproject()["project"]["version"]
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in releases]
    assert versions == sorted(set(versions), reverse=True)
    assert releases[-1][0] == "0.1.0"
    dates = [d for _, d in releases]
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", d) for d in dates)
    assert dates == sorted(dates, reverse=True)


def test_the_security_policy_says_where_to_report_and_which_versions_get_fixes():
    text = (ROOT / "SECURITY.md").read_text()
    assert f"{REPOSITORY}/security" in text and "Report a vulnerability" in text
    minor = ".".join(pyproject()["project"]["version"].split(".")[:2])
    assert f"latest 0.x minor ({minor})" in text
    for page in ("CHANGELOG.md", "SECURITY.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", (ROOT / page).read_text()):
            assert (ROOT / link).is_file(), f"{page} links to {link}, which is missing"

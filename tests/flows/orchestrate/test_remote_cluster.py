"""A remote Dask cluster with no shared file system: an S3-compatible server on loopback (moto's
server mode), a `dask scheduler` and two `dask worker` processes, each started in an empty folder of
its own. The smoke pipeline runs with `--storage s3://... --dask tcp://...`; its chunked stages
(clean, segment, augment) run on the workers, which read their chunks from the bucket; the outputs
in the bucket are byte-identical to a local run's."""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.procs import free_port, stop, zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
CHUNKED = ("download", "clean", "split", "segment", "augment")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "zhpipe-test",
        "AWS_SECRET_ACCESS_KEY": "zhpipe-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id="zhpipe-test",
        aws_secret_access_key="zhpipe-test",
        region_name="us-east-1",
    ).create_bucket(Bucket="zhpipe")
    yield env
    server.stop()


@pytest.fixture(scope="module")
def cluster(s3, prefect_harness, tmp_path_factory):
    """`dask scheduler` and two `dask worker`s, each in an empty folder, reporting their task runs
    to Prefect."""
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    env = {
        **os.environ,
        **s3,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    env.pop("ZHPIPE_PROJECT", None)
    procs = []
    folders = [tmp_path_factory.mktemp(name) for name in ("scheduler", "worker-1", "worker-2")]
    procs.append(
        subprocess.Popen(
            [
                str(BIN / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
            ],
            cwd=folders[0],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    )
    address = f"tcp://127.0.0.1:{port}"
    for folder in folders[1:]:
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "dask"),
                    "worker",
                    address,
                    "--nthreads",
                    "1",
                    "--nworkers",
                    "1",
                    "--no-dashboard",
                    "--local-directory",
                    str(folder),
                ],
                cwd=folder,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    from distributed import Client

    deadline = time.monotonic() + 120
    while True:
        try:
            with Client(address, timeout=5) as client:
                client.wait_for_workers(2, timeout=60)
                break
        except (OSError, TimeoutError):
            assert time.monotonic() < deadline, "the Dask cluster did not start"
            time.sleep(0.25)
    yield {"address": address, "folders": folders[1:]}
    # a worker's graceful close waits on its nanny for seconds: nothing of it is tested
    stop(*procs, grace=3)


def files(fs, root: str, stage: str) -> dict[str, str]:
    """sha256 of every data file of the stage's one output (the manifest, with its timings,
    aside)."""
    (key,) = [
        p.rsplit("/", 1)[-1]
        for p in fs.ls(f"{root}/{stage}", detail=False)
        if not p.rsplit("/", 1)[-1].startswith(".")
    ]
    out = {}
    for path in fs.find(f"{root}/{stage}/{key}"):
        if not path.endswith("manifest.json"):
            out[path.split(f"/{key}/", 1)[1]] = hashlib.sha256(fs.cat_file(path)).hexdigest()
    return out


def test_smoke_pipeline_on_a_remote_cluster_over_an_object_store(s3, cluster, tmp_path):
    import fsspec

    from flows.orchestrate.pipeline import pipeline_flow
    from tests.helpers.runs import without_profile

    env = {**os.environ, **s3, "ZHPIPE_CACHE": str(tmp_path / "driver-mirror")}
    from prefect.settings import PREFECT_API_URL

    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    common = zhpipe_argv("run", "smoke", "--to", "augment")
    remote = subprocess.run(
        [*common, "--storage", "s3://zhpipe/store", "--dask", cluster["address"]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert remote.returncode == 0, (remote.stdout + remote.stderr)[-4000:]
    # the reference: the same stages on one machine and a local folder (in this process: only its
    # files are compared)
    pipeline_flow("smoke", storage=str(tmp_path / "local"), stages=without_profile("augment"))

    bucket = fsspec.filesystem(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        key=s3["AWS_ACCESS_KEY_ID"],
        secret=s3["AWS_SECRET_ACCESS_KEY"],
    )
    disk = fsspec.filesystem("file")
    for stage in CHUNKED:
        in_bucket, on_disk = (
            files(bucket, "zhpipe/store", stage),
            files(disk, str(tmp_path / "local"), stage),
        )
        assert in_bucket and in_bucket == on_disk, stage
    # the chunks ran on the workers, which have nothing of this machine's store: their folders hold
    # no parquet
    printed = remote.stdout + remote.stderr
    # each chunked stage read its chunks from the bucket
    for fn in ("normalise_chunk", "segment_chunk", "eda_chunk"):
        assert f"{fn}: " in printed and "chunks on Dask (tcp://" in printed
    assert printed.count("reading s3://zhpipe/store/") >= 3, printed[-3000:]
    for folder in cluster["folders"]:
        assert not list(Path(folder).rglob("*.parquet"))

"""Runs whose jobs share no filesystem: input, outputs and the store in S3 (moto's server on
loopback, through a proxy that can stop), every job in an empty folder of its own (the
cluster-generic executor with tests/workflow/isolated/), as on a cloud batch service."""

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MODEL,
    REPO,
    S3_ENV,
    SLICE,
    Proxy,
    fasta,
    free_port,
    in_s3_isolated,
    jobs_run,
    kill_9_when,
    moto_server,
    object_run_check,
    refused_before_any_job,
    s3_client,
    snakemake_command,
    the_one_refusal,
)

import esmshard
from esmshard.compute.embedder import SLOW_BATCHES_ENV
from esmshard.files import TEMPORARY_NAME
from esmshard.outputs.reader import Embeddings

# the `cloud` extra, beside the tests' (a GPU node's `make gpu-check` collects these without it)
boto3 = pytest.importorskip("boto3")

RECORDS = SLICE[:30]
SETTINGS = [f"model={MODEL}", "repr_layers=[-1]", "include=[mean,per_tok]"]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server behind a Proxy, with the bucket `lab`."""
    with moto_server() as port:
        proxy = Proxy(port)
        client(proxy.port).create_bucket(Bucket="lab")
        yield proxy
        proxy.stop()


client = s3_client


def upload(s3, key: str, records) -> None:
    text = "".join(f"{header}\n{sequence}\n" for header, sequence in records)
    client(s3.port).put_object(Bucket="lab", Key=key, Body=text.encode())


def objects(s3, prefix: str) -> dict[str, bytes]:
    found = {}
    for page in (
        client(s3.port).get_paginator("list_objects_v2").paginate(Bucket="lab", Prefix=prefix)
    ):
        for item in page.get("Contents", []):
            body = client(s3.port).get_object(Bucket="lab", Key=item["Key"])["Body"].read()
            found[item["Key"]] = body
    return found


def cloud_command(workdir: Path, port: int, prefix: str, *more, env: dict | None = None):
    """The `snakemake` command of a run in object storage, each job in an empty folder (no
    config file: a job's node would not have it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    _, full_env = snakemake_command(workdir, {}, env={**S3_ENV, **(env or {})})
    cmd = [
        "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
        *in_s3_isolated(port, prefix),
        "--config", "input=proteins.fasta", "outdir=out", *SETTINGS, *more,
    ]  # fmt: skip
    return cmd, full_env


def run(cmd, env, check: bool = True, cwd=REPO) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert not check or done.returncode == 0, done.stderr[-4000:]
    return done


def values(h5_bytes: bytes) -> dict[tuple, np.ndarray]:
    """Each record's values of every kind and layer, by (id, kind, layer)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"esmshard-{os.getpid()}-{time.time()}.h5"
    path.write_bytes(h5_bytes)
    try:
        with Embeddings(path) as emb:
            return {
                (id_, kind, layer): emb.values(id_, kind, layer)
                for kind, layers in emb.layers.items()
                for layer in layers
                for id_ in emb.ids()
            }
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The same input embedded by a run on this machine's filesystem."""
    work = tmp_path_factory.mktemp("local")
    fasta(work / "proteins.fasta", RECORDS)
    cmd, env = snakemake_command(work / "run", {})
    run(cmd + ["--config", f"input={work / 'proteins.fasta'}", "outdir=out", *SETTINGS], env)
    return values((work / "run" / "out" / "embeddings.h5").read_bytes())


@pytest.fixture(scope="module")
def first(s3, tmp_path_factory):
    upload(s3, "a/proteins.fasta", RECORDS)
    cmd, env = cloud_command(tmp_path_factory.mktemp("a") / "run", s3.port, "a",
                             "neighbours=self", "neighbours_k=3")  # fmt: skip
    return run(cmd, env)


def assert_close(found: dict, expected: dict, within: float = 1e-6) -> None:
    """Within `within`, absolute and relative to the value. Runs that batch the sequences
    otherwise (a resumed job, another input's shard) differ in float32's last bits: 1e-5."""
    assert found.keys() <= expected.keys() and found
    for name, value in found.items():
        np.testing.assert_allclose(value, expected[name], rtol=within, atol=within, err_msg=name)


def test_outputs_in_the_bucket_equal_a_local_run(s3, first, local):
    assert jobs_run(first) == {"shard": 1, "embed": 1, "merge": 1, "neighbour_part": 1,
                               "neighbours": 1, "report": 1}  # fmt: skip
    found = objects(s3, "a/out/")
    # each job on a node of its own, its Snakemake's folder there too (none shares the run's)
    nodes = list(Path(first.args[first.args.index("-d") + 1]).parent.glob("node.*/job.sh"))
    assert len(nodes) == 6 and all(f"--directory {p.parent} " in p.read_text() for p in nodes)
    table = found["a/out/neighbours.tsv"].decode().splitlines()
    assert table[0] == "id\trank\tneighbour\tdistance" and len(table) == 1 + 3 * len(RECORDS)
    values_found = values(found["a/out/embeddings.h5"])
    assert values_found.keys() == local.keys()
    assert_close(values_found, local)
    summary = json.loads(found["a/out/run.json"])
    assert summary["computed"] == len(RECORDS)
    assert summary["inputs"] == ["s3://lab/a/proteins.fasta"]  # the object, not a local copy
    assert "a/out/report/scaling_report.html" in found
    assert "a/out/.esmshard/run.lease" not in found  # the driver's lease, removed as it ended
    # the run's last lines, read from the bucket, name the objects
    n = len(RECORDS)
    assert f": {n} computed, 0 from the store (s3://lab/a/out/store); 0 records failed, " in (
        first.stderr
    )
    assert "esmshard: outputs: s3://lab/a/out/embeddings.h5, " in first.stderr
    # the store is under the run's prefix: a part, its manifest, what its key stands for
    parts = [k for k in found if k.startswith("a/out/store/") and k.endswith(".h5")]
    assert len(parts) == 1 and "/.pieces/" not in parts[0]
    manifest = json.loads(found[parts[0].removesuffix(".h5") + ".json"])
    assert manifest["sha256"] == hashlib.sha256(found[parts[0]]).hexdigest()


def test_the_same_command_elsewhere_computes_nothing(s3, first, tmp_path):
    cmd, env = cloud_command(tmp_path / "elsewhere", s3.port, "a")
    again = run(cmd, env)
    assert jobs_run(again) == {}, again.stderr[-3000:]


def test_a_grown_input_computes_only_its_new_sequences(s3, first, tmp_path, local):
    new = SLICE[30:34]
    upload(s3, "a/proteins.fasta", RECORDS + new)
    cmd, env = cloud_command(tmp_path / "grown", s3.port, "a")
    grown = run(cmd, env)
    assert jobs_run(grown)["embed"] == 1
    found = objects(s3, "a/out/")
    summary = json.loads(found["a/out/run.json"])
    assert (summary["computed"], summary["from_store"]) == (len(new), len(RECORDS))
    assert_close(
        {
            k: v
            for k, v in values(found["a/out/embeddings.h5"]).items()
            if k[0] in {i for i, _, _ in local}
        },
        local,
    )


def esmshard_on(s3, *args) -> subprocess.CompletedProcess:
    """An esmshard command on this machine, the bucket's server where boto3 finds it."""
    env = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{s3.port}"}
    return subprocess.run(["esmshard", *args], env=env, capture_output=True, text=True)


def test_one_driver_at_a_time_and_a_killed_one_resumed_by_the_same_command(s3, tmp_path, local):
    """While a run's embed job keeps pieces, `esmshard status` on its outdir's URL shows the
    job from the progress it sends, and a second driver on the outdir (from another folder, as
    from another machine) is refused in one line by the outdir's lease; after kill -9 of the
    first, the same command takes the lease over and finishes, its embed job resuming from the
    pieces kept on the dead node; status and store --verify then say what they say of a folder,
    and a part damaged in the bucket is set aside there by name."""
    upload(s3, "k/proteins.fasta", RECORDS)
    slow = {SLOW_BATCHES_ENV: "1.0"}
    more = ["toks_per_batch=1024", "keep_every=1"]
    cmd, env = cloud_command(tmp_path / "killed", s3.port, "k", *more, env=slow)
    second = []

    def piece_kept() -> bool:
        # a piece counts once its .h5 is there (its manifest is sent first: esmshard.store.pieces)
        listed = client(s3.port).list_objects_v2(Bucket="lab", Prefix="k/out/store/")
        kept = any(
            "/.pieces/" in o["Key"] and o["Key"].endswith(".h5")
            for o in listed.get("Contents", [])
        )
        if kept:
            second.append(esmshard_on(s3, "status", "s3://lab/k/out"))
            second.append(
                run(*cloud_command(tmp_path / "second", s3.port, "k", *more), check=False)
            )
        return kept

    kill_9_when(cmd, env, piece_kept)  # the run, and with it every node's job
    live = second[0].stdout.splitlines()
    assert second[0].returncode == 0 and live[0] == "esmshard status s3://lab/k/out", live
    assert re.search(r" [0-9a-f]+-0000 \(\d+%\)", live[1] + live[2]), live  # the running job
    assert [ln for ln in live if ln.startswith("shards 0/1 (0%)  residues ")], live
    line = refused_before_any_job(second[1])
    assert line.startswith("esmshard: another esmshard run is active in s3://lab/k/out: the run of "
                           "process "), line  # fmt: skip
    assert "its lease s3://lab/k/out/.esmshard/run.lease" in line
    resumed = run(*cloud_command(tmp_path / "killed", s3.port, "k", *more))
    assert (
        "esmshard: took over the lease of a run that is gone: the run of process" in resumed.stderr
    )
    assert jobs_run(resumed)["embed"] == 1
    found = objects(s3, "k/out/")
    (log,) = [body.decode() for key, body in found.items() if "/logs/embed/" in key]
    kept, left = map(
        int,
        re.search(r"(\d+) sequences kept by an earlier job .*, (\d+) to compute", log).groups(),
    )
    assert kept > 0 and kept + left == len(RECORDS), log
    assert not [key for key in found if "/.pieces/" in key]  # merged into the part, then gone
    # its pieces batched as the kill fell: float32's sums in another order
    assert_close(values(found["k/out/embeddings.h5"]), local, within=1e-4)
    status = esmshard_on(s3, "status", "s3://lab/k/out")
    assert status.returncode == 0 and "shards 1/1 (100%)" in status.stdout, status.stdout
    assert status.stdout.rstrip().splitlines()[-1].endswith("finished"), status.stdout
    listed = esmshard_on(s3, "store", "s3://lab/k/out")
    assert listed.stdout.startswith("s3://lab/k/out/store:\n  ") and (
        f": {len(RECORDS)} sequences in 1 parts, " in listed.stdout
    ), listed.stdout
    verified = esmshard_on(s3, "store", "--verify", "s3://lab/k/out")
    assert (verified.returncode, verified.stdout) == (
        0,
        "s3://lab/k/out/store: 1 parts checked, 0 damaged\n",
    )
    (part,) = [key for key in found if key.startswith("k/out/store/") and key.endswith(".h5")]
    client(s3.port).put_object(Bucket="lab", Key=part, Body=found[part][:-7] + b"damaged")
    verified = esmshard_on(s3, "store", "--verify", "s3://lab/k/out")
    assert verified.returncode == 1 and verified.stdout.startswith(
        f"damaged: s3://lab/{part}: "
    ), verified.stdout + verified.stderr
    after = objects(s3, "k/out/store/")
    assert part not in after and f"{part}.corrupt" in after  # set aside in the bucket


def whole_files(s3, prefix: str) -> dict[str, bytes]:
    """The store's objects, every file (part or piece) checked against its manifest: a file
    under its final key is whole. A manifest alone is a piece whose upload was cut short."""
    found = objects(s3, prefix)
    for key in [key for key in found if key.endswith(".h5")]:
        manifest = json.loads(found[key.removesuffix(".h5") + ".json"])
        assert manifest["sha256"] == hashlib.sha256(found[key]).hexdigest(), key
    assert not [key for key in found if TEMPORARY_NAME.match(key.split("/")[-1])]
    return found


def store_is_whole(s3, prefix: str) -> list[str]:
    """The store's parts, whole, with no kept piece left (each merged into its part)."""
    found = whole_files(s3, prefix)
    assert not [key for key in found if "/.pieces/" in key]
    return [key for key in found if key.endswith(".h5")]


def test_two_runs_share_one_store_at_once(s3, tmp_path, local):
    halves = {"c1": RECORDS[:20], "c2": RECORDS[10:]}
    started = []
    for prefix, records in halves.items():
        upload(s3, f"{prefix}/proteins.fasta", records)
        cmd, env = cloud_command(tmp_path / prefix, s3.port, prefix, "store=s3://lab/shared")
        started.append(subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True))
    for process in started:
        assert process.wait(timeout=900) == 0, process.stderr.read()[-4000:]
    for prefix, records in halves.items():
        found = objects(s3, f"{prefix}/out/")
        summary = json.loads(found[f"{prefix}/out/run.json"])
        assert summary["computed"] + summary["from_store"] == len(records)
        assert_close(values(found[f"{prefix}/out/embeddings.h5"]), local, within=1e-5)
        assert not [key for key in found if key.startswith(f"{prefix}/out/store/")]
    assert len(store_is_whole(s3, "shared/")) == 2  # one part of each run's shard


def test_a_server_that_stops_mid_run_fails_the_job_in_one_line(s3, tmp_path, local):
    upload(s3, "s/proteins.fasta", RECORDS)
    slow = {SLOW_BATCHES_ENV: "0.3"}
    more = ["toks_per_batch=1024", "keep_every=1"]
    cmd, env = cloud_command(tmp_path / "stopped", s3.port, "s", *more, env=slow)
    process = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 600
    while not any("/.pieces/" in k for k in listing(s3, "s/out/store/")):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    s3.stop()
    try:
        assert process.wait(timeout=600) != 0
    finally:
        s3.start()
    (node,) = [
        p.parent
        for p in (tmp_path / "stopped").parent.glob("node.*/job.sh")
        if "embed:" in p.read_text()
    ]
    said = [
        line for line in (node / "job.out").read_text().splitlines() if " ERROR esmshard" in line
    ]
    assert (
        len(said) == 1
        and f"cannot reach the object store at http://127.0.0.1:{s3.port}" in said[0]
    ), said
    assert not [key for key in listing(s3, "s/out/") if key.endswith("embeddings.h5")]
    whole_files(s3, "s/out/store/")
    cmd, env = cloud_command(tmp_path / "stopped", s3.port, "s", *more)  # the same command
    run(cmd, env)
    store_is_whole(s3, "s/out/store/")
    assert_close(values(objects(s3, "s/out/")["s/out/embeddings.h5"]), local, within=1e-5)


def listing(s3, prefix: str) -> list[str]:
    listed = client(s3.port).list_objects_v2(Bucket="lab", Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", [])]


@pytest.fixture(scope="module")
def read_only_server():
    """moto's server with the bucket `lab` holding an input, and credentials that may read
    but not write there."""
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "5"}) as port:
        yield port, read_only_user(port)


def read_only_user(port: int) -> dict:
    """The credentials of a new user who may read but not write."""
    admin = client(port)
    admin.create_bucket(Bucket="lab")
    admin.put_object(Bucket="lab", Key="f/proteins.fasta", Body=b">a\nMKV\n")
    iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    iam.create_user(UserName="reader")
    policy = [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
              {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}]  # fmt: skip
    iam.put_user_policy(
        UserName="reader",
        PolicyName="read",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": policy}),
    )
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    return {
        "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
    }


def test_an_unreachable_server_is_said_before_any_job(tmp_path):
    port = free_port()
    cmd, env = cloud_command(tmp_path / "run", port, "f")
    line = refused_before_any_job(run(cmd, env, check=False))
    assert line == (
        f"esmshard: s3://lab/f: cannot reach the object store at http://127.0.0.1:{port}: check "
        "the address (--storage-s3-endpoint-url) and that the server is up"
    )


def test_missing_credentials_are_said_before_any_job(s3, tmp_path):
    nowhere = str(tmp_path / "none")
    unset = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
             "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_CONFIG_FILE": nowhere}  # fmt: skip
    cmd, env = cloud_command(tmp_path / "run", s3.port, "f", env=unset)
    line = the_one_refusal(object_run_check(cmd, env))
    assert line.startswith("esmshard: s3://lab/f: no credentials for the object store: set AWS_")


def test_a_missing_bucket_is_said_before_any_job(s3, tmp_path):
    cmd, env = cloud_command(tmp_path / "run", s3.port, "f")
    cmd[cmd.index("s3://lab/f")] = "s3://nolab/f"
    line = the_one_refusal(object_run_check(cmd, env))
    assert line == (
        f"esmshard: s3://nolab/f: bucket 'nolab' does not exist at http://127.0.0.1:{s3.port}: "
        "create it first"
    )


def test_no_permission_to_write_is_said_before_any_job(read_only_server, tmp_path):
    port, reader = read_only_server
    cmd, env = cloud_command(tmp_path / "run", port, "f", env=reader)
    line = the_one_refusal(object_run_check(cmd, env))
    assert line.startswith(
        "esmshard: s3://lab/f: the object store refused access (AccessDenied): "
    )
    assert line.endswith("give these credentials read and write permission on s3://lab/f")


def test_an_input_not_in_the_bucket_is_said_before_any_job(s3, tmp_path):
    cmd, env = cloud_command(tmp_path / "run", s3.port, "nothing-here")
    line = the_one_refusal(object_run_check(cmd, env))
    assert line == (
        "esmshard: input proteins.fasta is not in the object store "
        "(s3://lab/nothing-here/proteins.fasta): upload it there, or give its path relative to "
        "--default-storage-prefix"
    )


def test_runs_from_one_folder_keep_each_store_to_its_own_runs(s3, tmp_path):
    """`esmshard run` typed twice in one folder, into two buckets: the second run's new store
    computes its sequences and holds only its own; nothing of the first goes to the second
    bucket, and no copy of a store is left in the folder."""
    client(s3.port).create_bucket(Bucket="other")
    records = RECORDS[:6]
    text = "".join(f"{header}\n{sequence}\n" for header, sequence in records).encode()
    for bucket in ("lab", "other"):
        client(s3.port).put_object(Bucket=bucket, Key="w/small.fa", Body=text)
    work = tmp_path / "work"
    work.mkdir()
    _, env = snakemake_command(tmp_path / "settings", {}, env=S3_ENV)
    esmshard = str(Path(env["PATH"].split(os.pathsep)[0]) / "esmshard")
    lines = {}

    def typed(bucket, outdir):
        done = run([
            esmshard, "run", "small.fa", "-o", outdir, "--model", MODEL, "--",
            "--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{bucket}/w",
            "--storage-s3-endpoint-url", f"http://127.0.0.1:{s3.port}", "--shared-fs-usage", "none",
        ], env, cwd=work)  # fmt: skip
        return done.stderr

    for bucket, outdir in (("lab", "e1"), ("other", "e3")):
        lines[outdir] = typed(bucket, outdir)
    assert ": 6 computed, 0 from the store (s3://other/w/e3/store)" in lines["e3"]
    # a part damaged in the bucket is named by its key, in the driver's output and the log
    (part,) = [k for k in listing(s3, "w/e1/store/") if k.endswith(".h5")]
    body = bytearray(client(s3.port).get_object(Bucket="lab", Key=part)["Body"].read())
    body[len(body) // 2 : len(body) // 2 + 16] = b"\xff" * 16
    client(s3.port).put_object(Bucket="lab", Key=part, Body=bytes(body))
    grown = "".join(f"{header}\n{sequence}\n" for header, sequence in RECORDS[:7]).encode()
    client(s3.port).put_object(Bucket="lab", Key="w/small.fa", Body=grown)
    again = typed("lab", "e1")
    assert ": 7 computed, 0 from the store (s3://lab/w/e1/store)" in again
    assert (
        f"esmshard: 1 store part failed its check, set aside and recomputed (s3://lab/{part}; "
        "s3://lab/w/e1/logs/shard.log says why)"
    ) in again
    log = client(s3.port).get_object(Bucket="lab", Key="w/e1/logs/shard.log")["Body"].read()
    assert f"store part s3://lab/{part} fails its check (sha256 " in log.decode()
    listed = client(s3.port).list_objects_v2(Bucket="other")["Contents"]
    keys = [item["Key"] for item in listed]
    assert keys and all(k == "w/small.fa" or k.startswith("w/e3/") for k in keys), keys
    # what docs/writes-and-removes.md says a run in object storage keeps in its folder
    kept = {p.relative_to(work).as_posix() for p in work.glob("e*/*")}
    kept |= {p.relative_to(work).as_posix() for p in work.glob("e*/store/*")}
    assert kept == {"e1/.esmshard", "e1/store", "e1/store/.locks",
                    "e3/.esmshard", "e3/store", "e3/store/.locks"}, kept  # fmt: skip
    assert not [p for p in work.rglob("*") if "esmshard-store" in p.name and p.is_dir()]


def fill_store(s3, prefix: str, folder: Path, groups) -> set[str]:
    """A store of one part per group of records, made here and put under s3://lab/PREFIX; the
    keys of its parts' objects."""
    for records in groups:
        named = {h[1:].split()[0]: s for h, s in records}
        esmshard.embed(named, MODEL, repr_layers=[-1], include=["mean", "per_tok"], store=folder)
    put = set()
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not relative.startswith("."):
            client(s3.port).upload_file(str(path), "lab", f"{prefix}/{relative}")
            put.add(f"{prefix}/{relative}")
        elif path.name == ".esmshard-store.json":
            client(s3.port).upload_file(str(path), "lab", f"{prefix}/{relative}")
    return {key for key in put if key.endswith(".h5")}


def fetched_bytes(s3, prefix: str) -> tuple[int, list[str], dict[str, str]]:
    """What the shard step and merge of the run under PREFIX fetched of the store, from their
    logs: the bytes, the parts' values fetched, and each log."""
    total, parts, logs = 0, [], {}
    for step in ("shard", "merge"):
        log = client(s3.port).get_object(Bucket="lab", Key=f"{prefix}/out/logs/{step}.log")
        logs[step] = text = log["Body"].read().decode()
        total += sum(
            map(int, re.findall(r"store copy: \d+ of \d+ files fetched, (\d+) bytes", text))
        )
        parts += re.findall(r"fetched s3://lab/(\S+\.h5) \(", text)
    return total, parts, logs


def test_a_run_fetches_only_the_parts_that_hold_its_sequences(s3, tmp_path, local):
    """Jobs isolated, one store shared: 15 new proteins against a store of 2 parts copied in
    (no index yet: the shard step lists them and indexes them), then 15 more against 20 (18
    copied in, indexed by `esmshard store --verify`); neither run fetches the values of a part
    that holds none of its sequences, the second lists nothing and reads the index's nodes of
    its own keys, merge looks up its parts' files alone, and the bytes each fetches stay flat
    while the store grows tenfold."""
    groups = [SLICE[40 + 4 * i : 44 + 4 * i] for i in range(20)]
    filled = fill_store(s3, "grow", tmp_path / "filled", groups[:2])
    seen = []
    for prefix, records in (("g1", RECORDS[:15]), ("g2", RECORDS[15:30])):
        upload(s3, f"{prefix}/proteins.fasta", records)
        cmd, env = cloud_command(tmp_path / prefix, s3.port, prefix, "store=s3://lab/grow")
        run(cmd, env)
        total, parts, logs = fetched_bytes(s3, prefix)
        assert parts and not set(parts) & filled, parts  # only the parts of its own sequences
        seen.append(total)
        merged = re.search(r"store copy: (\d+) of (\d+) files", logs["merge"])
        # merge fetches the values and manifests of the run's parts alone (and the store's mark
        # and settings), and lists nothing
        assert int(merged[1]) <= int(merged[2]) <= 2 * len(set(parts)) + 2, merged[0]
        assert "parts' sequences indexed" in logs["merge"]
        found = objects(s3, f"{prefix}/out/")
        assert_close(values(found[f"{prefix}/out/embeddings.h5"]), local, within=1e-5)
        if prefix == "g1":
            assert "2 parts' sequences indexed" in logs["shard"], logs["shard"]
            filled |= fill_store(s3, "grow", tmp_path / "filled", groups[2:])
            verified = esmshard_on(s3, "store", "s3://lab/grow", "--verify")
            assert verified.returncode == 0, verified.stderr
            assert re.search(r"grow: 2\d parts checked, 0 damaged", verified.stdout), verified
        else:
            assert (
                "key index: " in logs["shard"] and "parts' sequences indexed" not in logs["shard"]
            )
            listed = re.search(r"store copy: (\d+) of (\d+) files", logs["shard"])
            assert int(listed[2]) <= 2, listed[0]  # the store's mark and the key's settings
    assert len(filled) == 20
    assert seen[1] < 1.5 * seen[0], seen  # a store ten times larger, about the same bytes


def test_values_in_place_in_a_bucket_are_read_where_they_lie(s3, tmp_path, local, monkeypatch):
    """Jobs isolated, `output_values=in_place` in 3 shards: no node writes the values again;
    embeddings.h5 names each protein's part by its object's URL, and open_embeddings on the
    bucket reads one protein equal to the local run's by ranged requests, fetching a small
    fraction of the run's bytes, and every protein by its URL alike."""
    upload(s3, "ip/proteins.fasta", RECORDS)
    cmd, env = cloud_command(tmp_path / "ip", s3.port, "ip", "output_values=in_place", "shards=3")
    run(cmd, env)
    found = objects(s3, "ip/out/")
    parts = [k for k in found if k.startswith("ip/out/store/") and k.endswith(".h5")]
    assert len(parts) == 3 and json.loads(found["ip/out/run.json"])["output_values"] == "in_place"
    run_bytes = sum(len(found[k]) for k in parts + ["ip/out/embeddings.h5"])
    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{s3.port}"}.items():
        monkeypatch.setenv(name, value)
    one = RECORDS[7][0][1:].split()[0]
    before = s3.sent["from the server"]
    with esmshard.open_embeddings("s3://lab/ip/out") as emb:
        protein = emb[one]
        read = s3.sent["from the server"] - before
        assert emb.parts.paths[0].startswith("s3://lab/ip/out/store/")
        # 3 shards, batched otherwise than the local run's one: float32's last bits differ
        assert_close({(one, "per_tok", 6): protein.per_tok[6], (one, "mean", 6): protein.mean[6]},
                     local, within=1e-5)  # fmt: skip
        every = {(id_, kind, 6): emb.values(id_, kind, 6) for id_ in emb.ids()
                 for kind in ("mean", "per_tok")}  # fmt: skip
    assert read < run_bytes / 4, (read, run_bytes)
    assert len(found["ip/out/embeddings.h5"]) < run_bytes / 10  # no second copy of the values
    assert_close(every, local, within=1e-5)
    assert len(every) == 2 * len(RECORDS)

"""The blob store (blobs/store.py) and large payloads published through the Bus.

BlobStore is tested on its own (round trip, idempotence, refusing malformed
references, atomic writes, gc; `blobs` imports nothing of ours, so it raises its
own errors and the bus's store raises them as BusErrors) and through the Bus: payloads whose JSON is
longer than `blob_threshold` go to `blobs/` beside the database, poll reads
them back transparently, and a missing or damaged blob is reported in
`payload_error`, never raised. Old files are made by setting their mtime
(os.utime), never by sleeping.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st

import blobs
from blobs.store import BlobCorrupt
from blobs.store import BlobMissing
from blobs.store import BlobStore
from bus import Bus
from bus import BusError
from bus import ValidationFailed
from bus.storage import errors
from bus.api import BLOB_THRESHOLD
from bus.api import GC_GRACE_SECONDS
from bus.storage.blob_errors import BusBlobStore
from bus.storage.errors import DiskFull
from bus.log.messages import prepare_row
from bus.log.payloads import PayloadPolicy
from tests.support.properties import scaled_settings

REF_PATTERN = r"sha256-[0-9a-f]{64}"
HOUR = 3600.0
_counter = itertools.count()


def fresh_dir(base: Path, name: str = "case") -> Path:
    """A new, not yet existing directory under `base` (one per Hypothesis example)."""
    return base / f"{name}-{next(_counter)}"


def sha_ref(data: bytes) -> str:
    return "sha256-" + hashlib.sha256(data).hexdigest()


def make_old(path: Path, age_s: float) -> float:
    """Set the file's mtime (and atime) `age_s` seconds into the past; return it."""
    when = time.time() - age_s
    os.utime(path, (when, when))
    return when


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def payload_of_json_length(length: int) -> str:
    """A string payload whose JSON text (with its two quotes) is exactly `length` bytes."""
    assert length >= 2
    payload = "x" * (length - 2)
    assert len(orjson.dumps(payload)) == length
    return payload


def message_row(bus: Bus, seq: int) -> tuple[str | None, str | None]:
    return bus.conn.execute("SELECT payload, payload_ref FROM messages WHERE seq = ?",
                            (seq,)).fetchone()


# --- importing ------------------------------------------------------------------


@pytest.mark.parametrize("statement", ["import blobs", "from blobs.store import BlobStore"])
def test_blobs_package_imports_in_a_fresh_interpreter(tmp_path: Path, python_env,
                                                      statement: str) -> None:
    ours = "sorted(m for m in sys.modules if m.split('.')[0] in ('bus', 'workers'))"
    result = subprocess.run([sys.executable, "-c", f"import sys; {statement}; print({ours})"],
                            env=python_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"  # blobs is the lowest package: it loads nothing of ours


def test_blobs_package_imports_after_bus(tmp_path: Path, python_env) -> None:
    statement = "import bus; import blobs; print(blobs.BlobStore)"
    result = subprocess.run([sys.executable, "-c", statement],
                            env=python_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "<class 'blobs.store.BlobStore'>\n"


# --- BlobStore: round trip ------------------------------------------------------


@scaled_settings(max_examples=40)
@given(data=st.binary(max_size=1 << 20))
@example(data=b"")
@example(data=os.urandom(1 << 20))
def test_blobstore_put_get_round_trip_any_bytes(tmp_path: Path, data: bytes) -> None:
    store = BlobStore(fresh_dir(tmp_path, "blobs"))
    ref = store.put(data)
    assert ref == sha_ref(data)
    assert store.get(ref) == data
    assert store.exists(ref)
    assert store.path(ref) == store.root / ref
    assert store.list_refs() == [ref]
    assert names_in(store.root) == [ref]  # nothing but the blob: no temp file left


@scaled_settings(max_examples=25)
@given(data=st.binary(max_size=4096))
def test_blobstore_put_twice_is_idempotent(tmp_path: Path, data: bytes) -> None:
    store = BlobStore(fresh_dir(tmp_path, "blobs"))
    other = store.put(b"some other blob")
    first = store.put(data)
    refs = store.list_refs()
    inode = store.path(first).stat().st_ino
    second = store.put(data)
    assert second == first
    assert store.list_refs() == refs == sorted({first, other})
    assert names_in(store.root) == refs
    assert store.path(first).stat().st_ino == inode  # not rewritten
    assert store.get(first) == data


def test_blobstore_put_existing_blob_refreshes_mtime(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ref = store.put(b"payload")
    old = make_old(store.path(ref), 10 * HOUR)
    assert store.path(ref).stat().st_mtime == pytest.approx(old, abs=1)
    before = time.time()
    assert store.put(b"payload") == ref
    assert store.path(ref).stat().st_mtime >= before - 1


def test_blobstore_put_creates_root_on_first_write(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "blobs"
    store = BlobStore(root)
    assert store.list_refs() == []
    assert not root.exists()  # reading does not create it
    ref = store.put(b"x")
    assert names_in(root) == [ref]


# --- BlobStore: missing, corrupt, malformed ---------------------------------------


def test_blobstore_get_missing_ref_raises_blob_missing(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ref = sha_ref(b"never stored")
    with pytest.raises(BlobMissing, match=ref):
        store.get(ref)
    assert not store.exists(ref)
    store.put(b"something else")
    with pytest.raises(BlobMissing):
        store.get(ref)


@pytest.mark.parametrize("damage", [
    pytest.param(lambda data: data[:-1], id="truncated"),
    pytest.param(lambda data: data + b"!", id="appended"),
    pytest.param(lambda data: bytes([data[0] ^ 1]) + data[1:], id="bit-flip"),
    pytest.param(lambda data: b"", id="emptied"),
])
def test_blobstore_get_changed_bytes_raises_blob_corrupt(tmp_path: Path, damage) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = b"the original bytes of the blob"
    ref = store.put(data)
    store.path(ref).write_bytes(damage(data))
    with pytest.raises(BlobCorrupt, match=ref):
        store.get(ref)
    assert store.exists(ref)  # exists() only looks for the file


MALFORMED_REFS = [
    pytest.param("sha256-xyz", id="short-non-hex"),
    pytest.param("../etc/passwd", id="parent-traversal"),
    pytest.param("", id="empty"),
    pytest.param(None, id="none"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("sha256-" + "A" * 64, id="upper-case-hex"),
    pytest.param("sha256-" + "0" * 63, id="63-digits"),
    pytest.param("sha256-" + "0" * 65, id="65-digits"),
    pytest.param("sha256-" + "0" * 64 + "/../../x", id="suffix-traversal"),
    pytest.param("sha256-" + "0" * 64 + "\n", id="trailing-newline"),
    pytest.param("md5-" + "0" * 32, id="other-algorithm"),
    pytest.param(".tmp-abc", id="temp-name"),
    pytest.param(b"sha256-" + b"0" * 64, id="bytes"),
    pytest.param(42, id="int"),
]


@pytest.mark.parametrize("ref", MALFORMED_REFS)
@pytest.mark.parametrize("method", ["get", "exists", "path"])
def test_blobstore_malformed_ref_is_refused_before_touching_files(tmp_path: Path, ref,
                                                                  method: str) -> None:
    # A readable file where "../etc/passwd" would lead if the ref were joined unchecked.
    secret = tmp_path / "etc" / "passwd"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0")
    store = BlobStore(tmp_path / "blobs")
    store.put(b"a real blob")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(blobs.BlobRefInvalid) as info:
        getattr(store, method)(ref)
    assert not isinstance(info.value, BusError)
    assert "is not a blob reference like 'sha256-<64 hex>'" in str(info.value)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert secret.read_bytes() == b"root:x:0:0"


def test_blobstore_list_refs_ignores_temp_and_foreign_files(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ref = store.put(b"kept")
    (store.root / ".tmp-crashed").write_bytes(b"half")
    (store.root / "README").write_text("not a blob")
    (store.root / ("sha256-" + "0" * 63)).write_bytes(b"almost a name")
    assert store.list_refs() == [ref]


# --- the bus's store: the same errors as BusErrors -------------------------------------


@pytest.mark.parametrize("ref", MALFORMED_REFS)
@pytest.mark.parametrize("method", ["get", "exists", "path"])
def test_bus_blob_store_malformed_ref_is_validation_failed(tmp_path: Path, ref,
                                                           method: str) -> None:
    store = BusBlobStore(tmp_path / "blobs")
    store.put(b"a real blob")
    before = names_in(store.root)
    with pytest.raises(ValidationFailed) as info:
        getattr(store, method)(ref)
    assert info.value.field == "ref"
    assert "is not a blob reference like 'sha256-<64 hex>'" in str(info.value)
    assert isinstance(info.value, blobs.BlobRefInvalid)  # still the store's class
    assert names_in(store.root) == before


def test_bus_blob_store_missing_and_corrupt_are_bus_errors(bus: Bus) -> None:
    missing = sha_ref(b"never stored")
    with pytest.raises(errors.BlobMissing, match=missing) as info:
        bus.blobs.get(missing)
    assert isinstance(info.value, BusError) and isinstance(info.value, BlobMissing)
    with pytest.raises(errors.BlobMissing, match=missing):
        bus.blobs.head(missing, 10)
    ref = bus.blobs.put(b"the original bytes")
    bus.blobs.path(ref).write_bytes(b"other bytes")
    with pytest.raises(errors.BlobCorrupt, match=ref) as info:
        bus.blobs.get(ref)
    assert isinstance(info.value, BusError) and isinstance(info.value, BlobCorrupt)


# --- BlobStore: atomic writes -------------------------------------------------------


@pytest.mark.parametrize("store_class, raised", [(BlobStore, OSError),
                                                  (BusBlobStore, DiskFull)])
def test_blobstore_failed_write_leaves_neither_blob_nor_temp(tmp_path: Path, monkeypatch,
                                                             store_class, raised) -> None:
    """The plain store lets the OSError through; the bus's store names it DiskFull."""
    store = store_class(tmp_path / "blobs")
    kept = store.put(b"written before the failure")

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("blobs.files.os.fsync", failing_fsync)
    with pytest.raises(raised, match="No space left"):
        store.put(b"never completed")
    monkeypatch.undo()
    assert names_in(store.root) == [kept]
    assert not store.exists(sha_ref(b"never completed"))


def test_blobstore_concurrent_reader_never_sees_partial_blob(tmp_path: Path) -> None:
    """While one thread writes large blobs, another sees each final name either
    absent or with complete bytes: a partial file under the final name fails."""
    store = BlobStore(tmp_path / "blobs")
    blobs = [os.urandom(2 << 20) + bytes([n]) for n in range(12)]
    refs = [sha_ref(b) for b in blobs]
    done = threading.Event()
    problems: list[str] = []
    observed_complete = set()

    def reader() -> None:
        while not done.is_set() or len(observed_complete) < len(refs):
            for ref in refs:
                try:
                    data = (store.root / ref).read_bytes()
                except FileNotFoundError:
                    continue
                if sha_ref(data) != ref:
                    problems.append(f"{ref} had {len(data)} bytes that do not match")
                else:
                    observed_complete.add(ref)
            if problems:
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for data in blobs:
            store.put(data)
    finally:
        done.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert problems == []
    assert observed_complete == set(refs)
    assert names_in(store.root) == sorted(refs)


# --- BlobStore: gc ------------------------------------------------------------------


@scaled_settings(max_examples=30)
@given(blobs=st.lists(st.tuples(st.binary(min_size=1, max_size=64), st.booleans(),
                                st.booleans()), max_size=12, unique_by=lambda t: t[0]),
       grace=st.sampled_from([0.0, 1.0, HOUR]))
def test_blobstore_gc_never_deletes_referenced_and_deletes_only_old_unreferenced(
        tmp_path: Path, blobs, grace: float) -> None:
    store = BlobStore(fresh_dir(tmp_path, "blobs"))
    referenced, old = set(), set()
    for data, is_referenced, is_old in blobs:
        ref = store.put(data)
        if is_referenced:
            referenced.add(ref)
        if is_old:
            make_old(store.path(ref), 2 * HOUR)
            old.add(ref)
    now = time.time()
    mtimes = {ref: store.path(ref).stat().st_mtime for ref in store.list_refs()}
    removed = store.gc(referenced, grace, now=now)
    # Unreferenced and untouched for longer than the grace period: every old one,
    # and with grace 0 (or a slow disk) even blobs written a moment ago.
    expected_removed = {r for r, mtime in mtimes.items()
                        if r not in referenced and mtime < now - grace}
    assert expected_removed >= old - referenced
    assert sorted(removed) == sorted(expected_removed)
    all_refs = {sha_ref(data) for data, _, _ in blobs}
    assert set(store.list_refs()) == all_refs - expected_removed
    for data, _, _ in blobs:
        if sha_ref(data) in referenced:
            assert store.get(sha_ref(data)) == data


def test_blobstore_gc_referenced_blob_survives_grace_zero_and_any_age(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ref = store.put(b"referenced")
    make_old(store.path(ref), 365 * 24 * HOUR)
    assert store.gc({ref}, 0.0) == []
    assert store.gc({ref}, 0.0, now=time.time() + 10 * 365 * 24 * HOUR) == []
    assert store.get(ref) == b"referenced"


def test_blobstore_gc_respects_grace_boundary(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ref = store.put(b"unreferenced")
    make_old(store.path(ref), 100.0)
    mtime = store.path(ref).stat().st_mtime
    assert store.gc(set(), 50.0, now=mtime + 49.0) == []       # 49 s old, grace 50
    assert store.gc(set(), 50.0, now=mtime + 50.0) == []       # exactly the grace: kept
    assert store.exists(ref)
    assert store.gc(set(), 50.0, now=mtime + 51.0) == [ref]    # older than the grace
    assert not store.exists(ref)


def test_blobstore_gc_removes_stale_temp_files_after_grace(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    store.root.mkdir(parents=True)
    stale = store.root / ".tmp-crashed-writer"
    stale.write_bytes(b"half a blob")
    make_old(stale, 2 * HOUR)
    fresh = store.root / ".tmp-writing-now"
    fresh.write_bytes(b"a blob being written")
    foreign = store.root / "notes.txt"
    foreign.write_text("not the store's")
    make_old(foreign, 2 * HOUR)
    assert store.gc(set(), HOUR) == []  # temp files are removed, but are not blobs
    assert names_in(store.root) == [".tmp-writing-now", "notes.txt"]


def test_blobstore_gc_on_missing_root_is_empty(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "never-created")
    assert store.gc(set(), 0.0) == []
    assert not store.root.exists()


# --- through the Bus: where large payloads go -----------------------------------------


def test_bus_large_payload_goes_to_blob_store_and_polls_back(bus: Bus, db_path: Path) -> None:
    payload = {"text": "y" * 10_000, "n": 1}
    result = bus.publish("a", "big", payload, to="w1")
    text, ref = message_row(bus, result.seq)
    assert text is None
    assert ref == sha_ref(orjson.dumps(payload))
    blob_file = db_path.parent / "blobs" / ref
    assert blob_file.is_file()
    assert orjson.loads(blob_file.read_bytes()) == payload
    [message] = bus.poll("w1")
    assert (message.payload, message.payload_error, message.payload_ref) == (payload, None, ref)
    assert message.to_json_dict()["payload"] == payload
    assert message.to_json_dict()["payload_ref"] == ref
    assert "payload_error" not in message.to_json_dict()
    [listed] = bus.list_messages()
    assert (listed.payload, listed.payload_ref) == (payload, ref)
    [last] = bus.last_messages(1)
    assert (last.payload, last.payload_ref) == (payload, ref)


def test_bus_payload_exactly_at_threshold_stays_inline(bus: Bus, db_path: Path) -> None:
    assert bus.blob_threshold == BLOB_THRESHOLD == 4096
    at = bus.publish("a", "t", payload_of_json_length(4096))
    above = bus.publish("a", "t", payload_of_json_length(4097))
    text, ref = message_row(bus, at.seq)
    assert (len(text), ref) == (4096, None)
    text, ref = message_row(bus, above.seq)
    assert text is None and ref is not None
    assert names_in(db_path.parent / "blobs") == [ref]
    first, second = bus.poll("anyone")
    assert (first.payload_ref, second.payload_ref) == (None, ref)
    assert first.payload == payload_of_json_length(4096)
    assert second.payload == payload_of_json_length(4097)


def test_bus_small_payload_creates_no_blob_directory(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "t", {"small": True})
    bus.publish("a", "t")
    assert not (db_path.parent / "blobs").exists()


@pytest.mark.parametrize("payload, stored_as_blob", [
    pytest.param("\u00e9" * 2047, False, id="2-byte-chars-4096-bytes"),
    pytest.param("\u00e9" * 2047 + "x", True, id="2-byte-chars-4097-bytes"),
    pytest.param("\u00e9" * 3000, True, id="3002-chars-6002-bytes"),
    pytest.param("\U0001f600" * 1023 + "xx", False, id="4-byte-chars-4096-bytes"),
    pytest.param("\U0001f600" * 1024, True, id="4-byte-chars-4098-bytes"),
])
def test_bus_threshold_counts_utf8_bytes_not_characters(bus: Bus, payload: str,
                                                         stored_as_blob: bool) -> None:
    size = len(orjson.dumps(payload))
    assert (size > bus.blob_threshold) == stored_as_blob
    assert len(payload) + 2 <= bus.blob_threshold  # by characters it would always stay inline
    result = bus.publish("a", "t", payload)
    text, ref = message_row(bus, result.seq)
    assert (ref is not None) == stored_as_blob
    assert (text is None) == stored_as_blob
    if stored_as_blob:
        assert ref == sha_ref(orjson.dumps(payload))
    [message] = bus.poll("w1")
    assert (message.payload, message.payload_error) == (payload, None)


def test_bus_custom_blob_threshold_and_blob_dir(tmp_path: Path) -> None:
    blob_dir = tmp_path / "elsewhere" / "store"
    db = tmp_path / "db" / "bus.db"
    with Bus.open(db, blob_threshold=10, blob_dir=blob_dir) as custom:
        inline = custom.publish("a", "t", "12345678")   # JSON: 10 bytes
        moved = custom.publish("a", "t", "123456789")   # JSON: 11 bytes
        assert message_row(custom, inline.seq) == ('"12345678"', None)
        _, ref = message_row(custom, moved.seq)
        assert ref == sha_ref(b'"123456789"')
        assert names_in(blob_dir) == [ref]
        assert not (db.parent / "blobs").exists()
        assert [m.payload for m in custom.poll("z")] == ["12345678", "123456789"]
    # Opened later with the default blob_dir, the blob is not found: reported, not raised.
    with Bus.open(db) as default_dir:
        second = default_dir.poll("z")[1]
        assert (second.payload, second.payload_error) == (None, "blob_missing")


@pytest.mark.parametrize("threshold", [0, -1, 1.5, True, "4096", None])
def test_bus_open_rejects_invalid_blob_threshold(db_path: Path, threshold) -> None:
    with pytest.raises(ValidationFailed) as info:
        Bus.open(db_path, blob_threshold=threshold)
    assert info.value.field == "blob_threshold"


def test_bus_same_large_payload_twice_shares_one_blob(bus: Bus, db_path: Path) -> None:
    payload = ["same"] * 2000
    first = bus.publish("a", "t", payload)
    second = bus.publish("b", "t", payload, to="w1")
    ref1, ref2 = message_row(bus, first.seq)[1], message_row(bus, second.seq)[1]
    assert ref1 == ref2
    assert names_in(db_path.parent / "blobs") == [ref1]
    assert [m.payload for m in bus.poll("w1")] == [payload, payload]


def test_bus_deleted_blob_polls_as_blob_missing(bus: Bus, db_path: Path) -> None:
    big = bus.publish("a", "big", {"x": "z" * 5000})
    bus.publish("a", "small", {"ok": True})
    ref = message_row(bus, big.seq)[1]
    (db_path.parent / "blobs" / ref).unlink()
    broken, fine = bus.poll("w1")
    assert (broken.payload, broken.payload_error, broken.payload_ref) == (None, "blob_missing", ref)
    assert broken.to_json_dict()["payload_error"] == "blob_missing"
    assert (fine.payload, fine.payload_error) == ({"ok": True}, None)


def test_bus_corrupted_blob_polls_as_blob_corrupt(bus: Bus, db_path: Path) -> None:
    big = bus.publish("a", "big", {"x": "z" * 5000})
    ref = message_row(bus, big.seq)[1]
    blob_file = db_path.parent / "blobs" / ref
    blob_file.write_bytes(blob_file.read_bytes().replace(b"z", b"Z", 1))
    [message] = bus.poll("w1")
    assert (message.payload, message.payload_error, message.payload_ref) == (
        None, "blob_corrupt", ref)
    [listed] = bus.list_messages()
    assert listed.payload_error == "blob_corrupt"


def test_bus_malformed_ref_in_database_polls_as_blob_corrupt(bus: Bus) -> None:
    seq = bus.publish("a", "t", {"x": "z" * 5000}).seq
    bus.conn.execute("UPDATE messages SET payload_ref = '../../etc/passwd' WHERE seq = ?", (seq,))
    [message] = bus.poll("w1")
    assert (message.payload, message.payload_error) == (None, "blob_corrupt")


def test_bus_blob_that_is_not_json_polls_as_decode_failed(bus: Bus) -> None:
    ref = bus.blobs.put(b"\xff not json")
    bus.publish("a", "t")
    bus.conn.execute("UPDATE messages SET payload_ref = ? WHERE seq = 1", (ref,))
    [message] = bus.poll("w1")
    assert (message.payload, message.payload_error, message.payload_ref) == (
        None, "decode_failed", ref)


def test_bus_publish_many_with_mixed_sizes(bus: Bus, db_path: Path) -> None:
    payloads = [{"n": 0}, "L" * 5000, None, {"n": 3, "big": ["q"] * 3000}, "s",
                payload_of_json_length(4096), "L" * 5000]
    results = bus.publish_many([{"from_agent": "a", "type": "t", "payload": p}
                                for p in payloads])
    rows = [message_row(bus, r.seq) for r in results]
    stored_as_blob = [ref is not None for _, ref in rows]
    assert stored_as_blob == [False, True, False, True, False, False, True]
    assert all(text is None for (text, ref) in rows if ref is not None)
    assert rows[1][1] == rows[6][1]  # the same bytes, one blob
    assert len(names_in(db_path.parent / "blobs")) == 2
    assert [m.payload for m in bus.poll("z", limit=100)] == payloads
    assert all(m.payload_error is None for m in bus.poll("z"))


def test_bus_publish_many_failing_validation_writes_no_blob(bus: Bus, db_path: Path) -> None:
    with pytest.raises(ValidationFailed):
        bus.publish_many([{"from_agent": "a", "type": "t", "payload": "L" * 5000},
                          {"from_agent": "", "type": "t"}])
    assert not (db_path.parent / "blobs").exists()
    assert bus.message_count() == 0


# --- through the Bus: gc ----------------------------------------------------------------


@scaled_settings(max_examples=25)
@given(plan=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=10),
       grace=st.sampled_from([0.0, 0.5, GC_GRACE_SECONDS]))
def test_bus_gc_blobs_never_deletes_a_referenced_blob(tmp_path: Path, plan, grace: float) -> None:
    """Each blob is referenced by a message or not (never published, or its message
    deleted), and old or not; gc keeps every referenced one whatever its age."""
    with Bus.open(fresh_dir(tmp_path, "bus") / "bus.db", blob_threshold=1) as bus:
        expected_gone = set()
        referenced = {}
        for n, (is_referenced, is_old) in enumerate(plan):
            payload = {"n": n}
            if is_referenced:
                seq = bus.publish("a", "t", payload).seq
                ref = message_row(bus, seq)[1]
                referenced[ref] = payload
            else:
                ref = bus.blobs.put(orjson.dumps(payload))
                if n % 2:  # published, then its message went away (compacted)
                    seq = bus.publish("a", "t", payload).seq
                    bus.conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))
            if is_old:
                make_old(bus.blobs.path(ref), 2 * GC_GRACE_SECONDS)
                if not is_referenced:
                    expected_gone.add(ref)
        removed = bus.gc_blobs(grace)
        assert set(removed) >= expected_gone
        assert not set(removed) & set(referenced)
        for ref, payload in referenced.items():
            assert orjson.loads(bus.blobs.get(ref)) == payload
        assert all(m.payload_error is None for m in bus.poll("z", limit=100))
        if grace == GC_GRACE_SECONDS:
            assert set(removed) == expected_gone


def test_bus_gc_blobs_removes_only_old_unreferenced(bus: Bus, db_path: Path) -> None:
    kept = message_row(bus, bus.publish("a", "t", "K" * 5000).seq)[1]
    old_orphan = bus.blobs.put(b'"old orphan"')
    young_orphan = bus.blobs.put(b'"young orphan"')
    make_old(bus.blobs.path(kept), 10 * HOUR)
    make_old(bus.blobs.path(old_orphan), 2 * HOUR)
    make_old(bus.blobs.path(young_orphan), 10.0)
    assert bus.gc_blobs() == [old_orphan]                 # default grace: one hour
    assert bus.gc_blobs(HOUR) == []
    assert bus.gc_blobs(5.0) == [young_orphan]
    assert names_in(db_path.parent / "blobs") == [kept]
    assert bus.poll("w1")[0].payload == "K" * 5000


def test_bus_gc_blobs_keeps_fresh_unreferenced_blob_of_publish_in_flight(bus: Bus) -> None:
    # A publisher has written its blob and not yet committed the message.
    in_flight = bus.blobs.put(orjson.dumps("P" * 5000))
    assert bus.gc_blobs() == []
    assert bus.blobs.exists(in_flight)
    # An old orphan that a new publish re-uses gets a fresh mtime from put,
    # so gc between that put and the commit keeps it too.
    make_old(bus.blobs.path(in_flight), 2 * HOUR)
    assert bus.blobs.put(orjson.dumps("P" * 5000)) == in_flight
    assert bus.gc_blobs() == []
    seq = bus.publish("a", "t", "P" * 5000).seq
    assert message_row(bus, seq)[1] == in_flight
    assert bus.gc_blobs(0.0) == []


def test_bus_gc_blobs_removes_stale_temp_file(bus: Bus, db_path: Path) -> None:
    blob_dir = db_path.parent / "blobs"
    blob_dir.mkdir()
    stale = blob_dir / ".tmp-abc123"
    stale.write_bytes(b"partial")
    make_old(stale, 2 * HOUR)
    fresh = blob_dir / ".tmp-def456"
    fresh.write_bytes(b"partial")
    assert bus.gc_blobs() == []  # removed, but not reported as a blob
    assert names_in(blob_dir) == [".tmp-def456"]


@pytest.mark.parametrize("grace", [-1, float("inf"), float("nan"), True, "10", None])
def test_bus_gc_blobs_rejects_invalid_grace(bus: Bus, grace) -> None:
    with pytest.raises(ValidationFailed) as info:
        bus.gc_blobs(grace)
    assert info.value.field == "grace_seconds"


def test_payload_policy_decides_inline_blob_or_refused_on_its_own(tmp_path: Path) -> None:
    """The one place that decides where a payload lives, without a Bus around it."""
    policy = PayloadPolicy(BusBlobStore(tmp_path / "blobs"), blob_threshold=10,
                           max_payload_bytes=100)
    small = prepare_row("a", "t", "12345678")  # '"12345678"': 10 bytes of JSON
    assert policy.place(small) is small and not (tmp_path / "blobs").exists()
    large = policy.place(prepare_row("a", "t", "123456789"))
    assert large.payload is None and policy.blobs.get(large.payload_ref) == b'"123456789"'
    with pytest.raises(ValidationFailed, match="content: is 102 bytes of JSON; the limit is 100"):
        policy.check_size(prepare_row("a", "t", "x" * 100), "content")
    # The quick path: only rows that cannot be near either limit (4 bytes a character) skip it.
    assert policy.all_inline([prepare_row("a", "t", 1), prepare_row("a", "t", None)])
    assert not policy.all_inline([small])


def test_payload_policy_staging_deletes_only_the_blobs_the_failed_block_wrote(
        tmp_path: Path) -> None:
    policy = PayloadPolicy(BusBlobStore(tmp_path / "blobs"), blob_threshold=10)
    kept = policy.place(prepare_row("a", "t", "written before"))
    with pytest.raises(RuntimeError), policy.staging():
        again = policy.place(prepare_row("a", "t", "written before"))  # already there: kept
        with policy.staging():  # nested: the outermost block decides
            new = policy.place(prepare_row("a", "t", "written inside"))
        raise RuntimeError("the write failed")
    assert again.payload_ref == kept.payload_ref and policy.blobs.exists(kept.payload_ref)
    assert not policy.blobs.exists(new.payload_ref)


def test_bus_hands_its_payload_policy_to_the_channels(tmp_path: Path) -> None:
    with Bus.open(tmp_path / "bus.db", blob_threshold=64, max_payload_bytes=1000) as bus:
        assert bus.channels.payloads is bus.payloads
        assert (bus.blob_threshold, bus.max_payload_bytes) == (64, 1000)
        bus.channels.create_channel("room", "broadcast", "a")
        sent = bus.channels.send_message("room", "a", "text", "x" * 100)
        assert bus.conn.execute("SELECT payload_ref FROM messages WHERE seq = ?",
                                (sent.seq,)).fetchone()[0] is not None


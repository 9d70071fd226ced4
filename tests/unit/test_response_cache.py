"""The response cache in process: hits skip `execute`, statistics count as Triton's, the bound
holds (LRU), and an unload or a reload drops a model's entries (model_repository_loader only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_model, load_repository
from model_repository_loader.repository import scan
from model_repository_loader.response_cache import ResponseCache, request_digest


@pytest.fixture(scope="module")
def root(repository: Callable[[str], Path]) -> Path:
    return repository("response_cache")  # its models share `cached`'s model.py


@pytest.fixture
def cached_repo(root: Path) -> Iterator[LoadedRepository]:
    repo = load_repository([root], into=LoadedRepository(cache=ResponseCache(1 << 20)))
    yield repo
    repo.close()


def ask(repo: LoadedRepository, model: str, values: list[float], **kwargs) -> dict:
    tensor = pb_utils.Tensor("INPUT0", np.array(values, dtype=np.float32))
    response = repo.models[model].infer(InferRequest([tensor], **kwargs), timeout=30)
    assert not response.has_error(), response.error()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def executions(repo: LoadedRepository, model: str, values: list[float], **kwargs) -> int:
    return int(ask(repo, model, values, **kwargs)["EXECUTIONS"][0])


def test_a_hit_does_not_run_execute(cached_repo: LoadedRepository) -> None:
    assert executions(cached_repo, "cached", [1, 2]) == 1
    assert executions(cached_repo, "cached", [1, 2]) == 1  # from the cache
    assert executions(cached_repo, "cached", [3]) == 2
    # The request id is not part of the key, as in Triton, nor a parameter the model's config
    # says does not change its answer (BRIDGE_CACHE_KEY_IGNORES: "p").
    assert executions(cached_repo, "cached", [3], parameters={"p": "x"}, request_id="r") == 2
    # A model without `response_cache { enable: true }` runs every time.
    assert [executions(cached_repo, "uncached", [1, 2]) for _ in range(2)] == [1, 2]
    snap = cached_repo.models["cached"].versions[1].stats.snapshot()
    assert (snap.cache_hit.count, snap.cache_miss.count) == (2, 2)
    assert (snap.success.count, snap.queue.count) == (4, 4)
    assert (snap.inference_count, snap.execution_count) == (2, 2)
    assert snap.cache_miss.ns > 0 and snap.cache_hit.ns > 0
    plain = cached_repo.models["uncached"].versions[1].stats.snapshot()
    assert (plain.cache_hit.count, plain.cache_miss.count) == (0, 0)


def test_parameters_the_model_reads_are_part_of_the_key(cached_repo: LoadedRepository) -> None:
    """Issue 38: with header forwarding, one tenant's cached answer must not reach another (in
    Triton 2.51 it does: its key ignores parameters)."""
    assert executions(cached_repo, "cached", [7], parameters={"tenant": "a"}) == 1
    assert executions(cached_repo, "cached", [7], parameters={"tenant": "a"}) == 1  # a hit
    assert executions(cached_repo, "cached", [7], parameters={"tenant": "b"}) == 2
    assert executions(cached_repo, "cached", [7], parameters={"tenant": 1}) == 3  # another type
    assert executions(cached_repo, "cached", [7]) == 4
    # Parameters Triton consumes itself never reach the model, so they stay out of the key.
    assert executions(cached_repo, "cached", [7], parameters={"priority": 1, "timeout": 5}) == 4
    # The ensemble keys alike.
    ensemble = [
        executions(cached_repo, "cached_ensemble", [8], parameters={"tenant": t})
        for t in ("a", "a", "b")
    ]
    assert ensemble[0] == ensemble[1] != ensemble[2]


def test_a_hit_counts_no_negative_queue_time(cached_repo: LoadedRepository) -> None:
    """A hit's queue time runs from its arrival to its cache lookup, never below zero (the
    statistics' queue sum is a uint64 on the wire: a negative sum failed the statistics call)."""
    ask(cached_repo, "cached", [5])
    stats = cached_repo.models["cached"].versions[1].stats
    after_the_miss = stats.snapshot().queue.ns
    for _ in range(5):
        ask(cached_repo, "cached", [5])
    assert stats.snapshot().queue.count == 6
    assert stats.snapshot().queue.ns >= after_the_miss


def test_requested_outputs_are_part_of_the_key(cached_repo: LoadedRepository) -> None:
    subset = ask(cached_repo, "cached", [5], requested_outputs=["EXECUTIONS"])
    assert set(subset) == {"EXECUTIONS"}
    full = ask(cached_repo, "cached", [5])
    assert set(full) == {"EXECUTIONS", "OUTPUT0"}  # Triton answers the cached subset here
    np.testing.assert_array_equal(full["OUTPUT0"], [10.0])


def test_without_a_server_cache_nothing_is_cached(root: Path) -> None:
    repo = load_repository([root], only=["cached"])
    try:
        assert [executions(repo, "cached", [1]) for _ in range(2)] == [1, 2]
    finally:
        repo.close()


def test_reload_and_unload_drop_the_entries(cached_repo: LoadedRepository, root: Path) -> None:
    cache = cached_repo.cache
    assert cache is not None
    assert executions(cached_repo, "cached", [7]) == 1
    assert cache.counters().entries == 1
    # A reload: a new generation loads beside, the old one closes.
    (source,) = [s for s in scan([root]) if s.name == "cached"]
    new = load_model(source, within=cached_repo)
    old, cached_repo.models["cached"] = cached_repo.models["cached"], new
    old.close()
    assert cache.counters().entries == 0
    assert executions(cached_repo, "cached", [7]) == 1  # computed again by the new model
    new.close()
    assert cache.counters().entries == 0


def test_the_size_bound_evicts_the_least_recently_used() -> None:
    one = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.zeros(100, dtype=np.uint8))])
    cache = ResponseCache(3 * 100 + 200)  # room for two such entries with their overhead
    owner = cache.new_owner()

    def key(n: int) -> tuple[int, bytes]:
        return (owner, request_digest([pb_utils.Tensor("I", np.array([n]))], []))

    for n in (1, 2):
        assert cache.insert(key(n), one)
    assert cache.lookup(key(1)) is not None  # 1 is now the most recently used
    assert cache.insert(key(3), one)
    assert cache.lookup(key(2)) is None and cache.lookup(key(1)) is not None
    counters = cache.counters()
    assert (counters.entries, counters.evictions) == (2, 1)
    assert counters.used_bytes <= cache.capacity_bytes
    assert not cache.insert(key(3), one)  # already there: not a miss (Triton's ALREADY_EXISTS)
    big = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.zeros(1000, dtype=np.uint8))])
    assert cache.insert(key(4), big) and cache.lookup(key(4)) is None  # larger than the cache
    error = pb_utils.InferenceResponse(error=pb_utils.TritonError("no"))
    assert cache.insert(key(5), error) and cache.lookup(key(5)) is None


def test_keys_tell_shapes_datatypes_and_bytes_apart() -> None:
    def digest(array: np.ndarray) -> bytes:
        return request_digest([pb_utils.Tensor("I", array)], [])

    base = np.arange(4, dtype=np.int32)
    assert digest(base) == digest(base.copy())
    assert digest(base) != digest(base.reshape(2, 2))
    assert digest(base) != digest(base.view(np.float32))
    assert digest(base) != digest(base + 1)
    words = np.array([b"ab", b"c"], dtype=np.object_)
    assert digest(words) != digest(np.array([b"a", b"bc"], dtype=np.object_))


def test_a_hit_hands_out_a_writable_copy(cached_repo: LoadedRepository) -> None:
    first = ask(cached_repo, "cached", [9])
    second = ask(cached_repo, "cached", [9])
    second["OUTPUT0"][0] = -1
    np.testing.assert_array_equal(ask(cached_repo, "cached", [9])["OUTPUT0"], first["OUTPUT0"])


def test_cache_config_flags() -> None:
    from bridge.cli import parse_cache_config

    assert parse_cache_config([], None) == 0
    assert parse_cache_config(["local,size=1048576"], None) == 1048576
    assert parse_cache_config([], 4096) == 4096  # the deprecated --response-cache-byte-size
    for bad in ("redis,host=localhost", "local,capacity=10", "local,size=-1", "local"):
        with pytest.raises(ValueError, match="--cache-config"):
            parse_cache_config([bad], None)


def test_metrics_render_the_cache_families(cached_repo: LoadedRepository) -> None:
    from bridge.metrics.triton import TritonMetrics

    executions(cached_repo, "cached", [1])
    executions(cached_repo, "cached", [1])
    text = TritonMetrics(lambda: cached_repo.models, cache=cached_repo.cache).render()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 1' in text
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 1' in text
    assert 'nv_cache_num_hits_per_model{model="uncached"' not in text  # not enabled there
    assert "\nnv_cache_num_entries 1\n" in text and "\nnv_cache_num_lookups 2\n" in text
    assert "# TYPE nv_cache_util gauge" in text


def test_an_ensemble_hit_skips_its_steps(cached_repo: LoadedRepository) -> None:
    first = executions(cached_repo, "cached_ensemble", [4])
    assert executions(cached_repo, "cached_ensemble", [4]) == first  # `uncached` did not run
    assert executions(cached_repo, "uncached", [4]) == first + 1
    snap = cached_repo.models["cached_ensemble"].versions[1].stats.snapshot()
    assert (snap.cache_hit.count, snap.cache_miss.count, snap.success.count) == (1, 1, 2)

import json
import os

import pytest

from tfcluster import tfconfig


def test_one_chief_and_distinct_worker_tasks():
    endpoints = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]
    configs = [json.loads(text) for text in tfconfig.render_all(endpoints)]
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert all(c["cluster"] == {"chief": ["10.0.0.1:2222"],
                                "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]} for c in configs)


def test_single_worker_is_a_lone_chief():
    assert json.loads(tfconfig.render_all(["127.0.0.1:5000"])[0]) == {
        "cluster": {"chief": ["127.0.0.1:5000"]}, "task": {"type": "chief", "index": 0}}


def test_rejects_duplicate_endpoints_and_bad_index():
    with pytest.raises(ValueError, match="distinct"):
        tfconfig.cluster_spec(["a:1", "a:1"])
    with pytest.raises(ValueError, match="outside"):
        tfconfig.render(["a:1"], 1)
    with pytest.raises(ValueError):
        tfconfig.cluster_spec([])


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_tensorflow_resolver_accepts_every_rendered_config(workers, monkeypatch):
    import tensorflow as tf

    endpoints = [f"127.0.0.1:{20000 + i}" for i in range(workers)]
    for index, text in enumerate(tfconfig.render_all(endpoints)):
        monkeypatch.setitem(os.environ, "TF_CONFIG", text)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        expected_type, expected_index = tfconfig.task_of(index)
        assert (resolver.task_type, resolver.task_id) == (expected_type, expected_index)
        spec = resolver.cluster_spec()
        assert spec.num_tasks("chief") == 1
        assert ("worker" in spec.jobs) == (workers > 1)
        if workers > 1:
            assert spec.num_tasks("worker") == workers - 1
        assert sorted(spec.as_dict().get("chief", []) + spec.as_dict().get("worker", [])) == sorted(endpoints)
        assert spec.task_address(expected_type, expected_index) == endpoints[index]

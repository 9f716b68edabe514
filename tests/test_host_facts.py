"""``sim.host_facts``: what a validation run records of its machine, cards as CUDA_VISIBLE_DEVICES names them."""

from sim.host_facts import host_facts, visible_gpus

ROWS = [("0", "GPU-aaaa-1111", "NVIDIA H200"), ("1", "GPU-bbbb-2222", "NVIDIA H200")]


def test_every_card_without_cuda_visible_devices():
    assert [g["uuid"] for g in visible_gpus(ROWS, None)] == ["GPU-aaaa-1111", "GPU-bbbb-2222"]


def test_cards_by_index_or_uuid_prefix_in_the_order_named():
    assert visible_gpus(ROWS, "1") == [{"index": 1, "uuid": "GPU-bbbb-2222", "name": "NVIDIA H200"}]
    assert [g["index"] for g in visible_gpus(ROWS, "GPU-bbbb,0")] == [1, 0]


def test_entries_naming_no_card_are_left_out():
    assert visible_gpus(ROWS, "") == []
    assert [g["index"] for g in visible_gpus(ROWS, "7,0,0")] == [0]


def test_host_facts_name_the_machine_and_its_visible_cards():
    facts = host_facts({"CUDA_VISIBLE_DEVICES": "1"}, gpus=lambda: ROWS)
    assert facts["hostname"] and facts["cpu"] and facts["cpus"] >= 1
    assert facts["gpus"] == [{"index": 1, "uuid": "GPU-bbbb-2222", "name": "NVIDIA H200"}]


def test_a_machine_without_nvidia_smi_has_no_cards():
    assert host_facts({}, gpus=lambda: [])["gpus"] == []

"""Bad system descriptions get one-line errors naming the field, the value and what is allowed."""

import pytest

from mcdla.errors import HardwareError
from mcdla.hardware import PoolLink, load_system, save_system, system_from_dict, system_to_dict


def _tiny(**over):
    data = {
        "format": "mcdla-system/1",
        "name": "tiny",
        "devices": [{"name": "gpu0", "peak_flops_per_s": {"fp16": "100TFLOP/s"}, "hbm": "16GiB",
                     "hbm_bandwidth": "900GB/s", "source": "test"}],
        "memories": [{"name": "host0", "kind": "host", "capacity": "64GiB", "dram_bandwidth": "80GB/s", "source": "test"}],
        "switches": [],
        "links": [{"a": "gpu0", "b": "host0", "bandwidth": "16GB/s", "kind": "pcie", "source": "test"}],
        "pools": {"gpu0": ["host0"]},
    }
    data.update(over)
    return data


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_tiny_system_loads_in_base_units() -> None:
    """Unit strings become bytes, bytes/s and FLOP/s."""
    s = system_from_dict(_tiny())
    assert s.devices[0].hbm_bytes == 16 * 2**30 and s.links[0].bytes_per_s == 16e9
    assert s.devices[0].flops_per_s("fp16") == 100e12


def test_round_trip_through_file(tmp_path) -> None:
    """save_system then load_system gives back an equal system (YAML and JSON)."""
    for suffix in (".yaml", ".json"):
        original = load_system("mc-dla")
        path = tmp_path / f"sys{suffix}"
        save_system(original, path)
        assert load_system(path) == original


def test_unknown_preset() -> None:
    """An unknown preset name lists the presets."""
    with pytest.raises(HardwareError) as info:
        load_system("dgx-9000")
    assert "dgx-9000" in _one_line(info) and "dc-dla" in str(info.value)


def test_negative_bandwidth() -> None:
    """A negative link bandwidth names the field and the value."""
    links = [{"a": "gpu0", "b": "host0", "bandwidth": "-3GB/s", "source": "t"}]
    with pytest.raises(HardwareError) as info:
        system_from_dict(_tiny(links=links))
    assert "links[0].bandwidth" in _one_line(info) and "-3GB/s" in str(info.value)


def test_disconnected_topology() -> None:
    """A node that reaches nothing makes the topology disconnected."""
    switches = [{"name": "lonely"}]
    with pytest.raises(HardwareError) as info:
        system_from_dict(_tiny(switches=switches))
    assert "disconnected" in _one_line(info) and "lonely" in str(info.value)


def test_device_without_route_to_pool() -> None:
    """A device whose pool memory is reachable only through another device has no route."""
    data = _tiny()
    data["devices"].append(dict(data["devices"][0], name="gpu1"))
    data["links"] = [{"a": "gpu1", "b": "gpu0", "bandwidth": "25GB/s", "source": "t"},
                     {"a": "gpu0", "b": "host0", "bandwidth": "16GB/s", "source": "t"}]
    data["pools"] = {"gpu0": ["host0"], "gpu1": ["host0"]}
    with pytest.raises(HardwareError) as info:
        system_from_dict(data)
    assert "no route from 'gpu1' to 'host0'" in _one_line(info)


def test_unknown_field_and_missing_field() -> None:
    """Unknown and missing fields are named."""
    with pytest.raises(HardwareError, match="bandwith: unknown field"):
        system_from_dict(_tiny(links=[{"a": "gpu0", "b": "host0", "bandwith": "1GB/s", "bandwidth": "1GB/s", "source": "t"}]))
    with pytest.raises(HardwareError, match=r"devices\[0\].hbm: missing"):
        d = _tiny()
        del d["devices"][0]["hbm"]
        system_from_dict(d)


def test_pool_link_rejects_nonpositive_bandwidth() -> None:
    """PoolLink names the bad field."""
    with pytest.raises(HardwareError, match="link.offload_bytes_per_s: got -1"):
        PoolLink(offload_bytes_per_s=-1, prefetch_bytes_per_s=1)


def test_system_to_dict_is_loadable() -> None:
    """The dict form validates again."""
    assert system_from_dict(system_to_dict(load_system("dc-dla"))) == load_system("dc-dla")


def test_format_doc_example_loads() -> None:
    """The example in docs/hardware-format.md is a valid system file."""
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "hardware-format.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    system = system_from_dict(yaml.safe_load(block))
    assert system.name == "my-box" and len(system.devices) == 2


def test_non_finite_efficiency_and_long_values_are_short_one_liners() -> None:
    """NaN efficiency is refused; a 5000-character or container value is not printed back whole."""
    device = dict(_tiny()["devices"][0])
    for field, bad in (("compute_efficiency", float("nan")), ("hbm", "x" * 5000), ("hbm", [[1] * 1000] * 1000)):
        with pytest.raises(HardwareError) as info:
            system_from_dict(_tiny(devices=[device | {field: bad}]))
        assert f"devices[0].{field}" in _one_line(info) and len(str(info.value)) < 300


@pytest.mark.parametrize("key", ["\n", "a\nb", "x" * 5000, "ünïcode key"])
def test_unknown_field_with_an_odd_name_is_one_short_line(key) -> None:
    """A key from the file that is not a plain name is quoted and bounded (found by the fuzz test: a key
    "\\n" made a two-line message)."""
    data = system_to_dict(load_system("dc-dla"))
    data[key] = None
    with pytest.raises(HardwareError, match="unknown field") as info:
        system_from_dict(data)
    message = str(info.value)
    assert "\n" not in message and len(message) < 200

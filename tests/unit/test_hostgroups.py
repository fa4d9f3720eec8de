"""--host selections: several hosts, comma lists, groups of hosts/groups.yaml, 'all'; clear
errors (file, group, fix) for unknown names, empty groups and cycles."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from outrig.errors import ConfigError
from outrig.hostgroups import expand_hosts, split_values
from outrig.inventory import host_files


def _hosts(tmp_path: Path, names: list[str], groups: object = None) -> Path:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for name in names:
        (hosts / f"{name}.yaml").write_text(yaml.safe_dump(
            {"hostname": f"{name}.example", "workdir": f"/w/{name}"}))
    if groups is not None:
        (hosts / "groups.yaml").write_text(yaml.safe_dump(groups))
    return hosts


def test_repeated_and_comma_separated_values_keep_order_once_each(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["a", "b", "c"])
    assert split_values(["a,b", " c ", ""]) == ["a", "b", "c"]
    assert expand_hosts(["b,a", "c", "a"], hosts) == ["b", "a", "c"]
    assert expand_hosts(["root@10.0.0.1:2222,a"], hosts) == ["root@10.0.0.1:2222", "a"]


def test_all_is_every_host_file_but_not_the_groups_file(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["n2", "n1"], {"groups": {"g": ["n1"]}})
    assert host_files(hosts) == ["n1", "n2"]
    assert expand_hosts(["all"], hosts) == ["n1", "n2"]


def test_groups_nest_and_mix_files_addresses_and_groups(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["a", "b", "c"], {"groups": {
        "pair": ["a", "b"], "sweep": ["pair", "c", "ubuntu@203.0.113.7:40222", "a"]}})
    assert expand_hosts(["sweep"], hosts) == ["a", "b", "c", "ubuntu@203.0.113.7:40222"]
    assert expand_hosts(["c,pair"], hosts) == ["c", "a", "b"]


def test_a_cycle_names_the_file_and_the_loop(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["a"], {"groups": {"x": ["a", "y"], "y": ["z"], "z": ["x"]}})
    with pytest.raises(ConfigError) as err:
        expand_hosts(["x"], hosts)
    text = str(err.value)
    assert str(hosts / "groups.yaml") in text and "x → y → z → x" in text


def test_an_empty_group_names_the_file_and_the_key(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["a"], {"groups": {"spare": []}})
    with pytest.raises(ConfigError) as err:
        expand_hosts(["a,spare"], hosts)
    assert f"{hosts / 'groups.yaml'}: groups.spare: the group is empty" in str(err.value)


def test_an_unknown_member_fails_before_anything_and_names_its_group(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, ["a"], {"groups": {"pair": ["a", "nosuch"]}})
    with pytest.raises(ConfigError) as err:
        expand_hosts(["pair"], hosts)
    text = str(err.value)
    assert "unknown host 'nosuch'" in text and "a member of group pair" in text
    assert "known groups: pair" in text and "Nothing was sent" in text
    with pytest.raises(ConfigError, match="unknown host 'pairr'.*known groups: pair"):
        expand_hosts(["pairr"], hosts)


def test_all_without_host_files_and_an_empty_selection_are_errors(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, [])
    with pytest.raises(ConfigError, match="no host files in"):
        expand_hosts(["all"], hosts)
    with pytest.raises(ConfigError, match="--host is empty"):
        expand_hosts([" , "], hosts)


@pytest.mark.parametrize("doc, needle", [
    (["a"], "must hold one key, groups:"),
    ({"groups": ["a"]}, "groups: must map each group name"),
    ({"groups": {"g": "a"}}, "groups.g: must be a list of host names"),
    ({"groups": {"all": ["a"]}}, "groups.all: 'all' already means every host file"),
])
def test_a_malformed_groups_file_says_where_and_how(tmp_path: Path, doc: object,
                                                    needle: str) -> None:
    hosts = _hosts(tmp_path, ["a"], doc)
    with pytest.raises(ConfigError, match="groups.yaml") as err:
        expand_hosts(["a"], hosts)
    assert needle in str(err.value)


def test_one_host_commands_refuse_a_selection(tmp_path: Path) -> None:
    from outrig.cli.settings import Settings
    from outrig.hostgroups import names_several
    from outrig.session import Project

    hosts = _hosts(tmp_path, ["a", "b"], {"groups": {"pair": ["a", "b"]}})
    assert [names_several(v, hosts) for v in ("a", "a,b", "pair", "all")] == [
        False, True, True, True]
    settings = Settings(Project(tmp_path), "test")
    assert settings.host("a") == "a"
    with pytest.raises(ConfigError, match="--host pair names several hosts"):
        settings.host("pair")
    assert settings.hosts(["pair", "a"]) == ["a", "b"]

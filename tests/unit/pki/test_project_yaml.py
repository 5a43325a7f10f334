"""project.yaml validation: every rule, its message, and every error of a file at once."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from atoll.pki.identity import ROLES
from atoll.pki.project import ProjectError, Role, load_project, parse_project


def problems(doc: Any) -> dict[str, str]:
    """path -> message of every problem ``doc`` has (fails if it is valid); two problems at
    one path are joined with " | "."""
    with pytest.raises(ProjectError) as info:
        parse_project(doc)
    found: dict[str, str] = {}
    for issue in info.value.issues:
        found[issue.path] = " | ".join(filter(None, [found.get(issue.path), issue.message]))
    return found


def test_the_design_example_is_valid(example: dict[str, Any]) -> None:
    project = parse_project(example)
    assert [s.name for s in project.sites] == ["hospital-a", "hospital-b", "university"]
    assert project.users[1].role == "lead"
    assert project.studies["outcomes"].sites == ["hospital-a", "hospital-b"]
    assert project.studies_of("university") == ["pathology"]
    assert project.studies_of("hospital-a") == ["pathology", "outcomes"]


def test_role_literal_matches_the_roles_certificates_carry() -> None:
    assert typing.get_args(Role) == ROLES


@pytest.mark.parametrize(
    ("host", "listen_host"),
    [
        ("fl.example.org", "0.0.0.0"),
        ("10.0.0.5", "0.0.0.0"),
        ("localhost", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),  # the address itself: a server dialled at [::1] must listen there
        ("127.0.0.2", "127.0.0.2"),
    ],
)
def test_listen_defaults_to_loopback_only_for_a_loopback_server(
    example: dict[str, Any], host: str, listen_host: str
) -> None:
    example["server"]["host"] = host
    server = parse_project(example).server
    assert (server.listen.host, server.listen.port) == (listen_host, 8443)


def test_listen_can_be_set(example: dict[str, Any]) -> None:
    example["server"]["listen"] = {"host": "::", "port": 9000}
    assert parse_project(example).server.listen.model_dump() == {"host": "::", "port": 9000}
    example["server"]["listen"] = {"port": 9001}
    assert parse_project(example).server.listen.model_dump() == {"host": "0.0.0.0", "port": 9001}


def test_server_name_defaults_to_server(example: dict[str, Any]) -> None:
    del example["server"]["name"]
    assert parse_project(example).server.name == "server"


def test_sites_users_and_studies_are_optional() -> None:
    project = parse_project({"name": "p", "server": {"host": "localhost", "port": 1}})
    assert (project.sites, project.users, project.studies) == ([], [], {})


def test_every_problem_of_a_document_is_reported_at_once(example: dict[str, Any]) -> None:
    example["name"] = "Bad Name"
    example["server"]["port"] = 0
    example["sites"][0]["name"] = "Hospital_A"
    example["sites"][1]["colour"] = "blue"
    example["users"][0]["role"] = "admin"
    example["studies"]["default"] = {"sites": ["nowhere"], "admins": []}
    found = problems(example)
    assert set(found) == {
        "name",
        "server.port",
        "sites[0].name",
        "sites[1].colour",
        "users[0].role",
        "studies.default",
        "studies.default.sites[0]",
        "studies.pathology.sites[0]",  # hospital-a no longer exists: renamed (invalidly) above
        "studies.outcomes.sites[0]",
    }


def test_errors_are_listed_in_document_order(example: dict[str, Any]) -> None:
    example["studies"]["zz"] = {"sites": ["x"]}
    example["users"][1]["org"] = ""
    example["sites"][2]["name"] = "hospital-a"  # so "university" is no longer provisioned
    example["server"]["extra"] = 1
    assert list(problems(example)) == [
        "server.extra",
        "sites[2].name",
        "users[1].org",
        "studies.pathology.sites[2]",
        "studies.zz.sites[0]",
    ]


@pytest.mark.parametrize(
    ("section", "doc_patch", "path", "expected"),
    [
        (
            "unknown top key",
            {"sitez": []},
            "sitez",
            "unknown key; allowed keys: name, server, sites",
        ),
        (
            "unknown server key",
            {"server": {"host": "h", "port": 1, "tls": 1}},
            "server.tls",
            "allowed keys: name, host, port, listen",
        ),
        ("missing server", {"server": None}, "server", "must be a mapping"),
        ("port type", {"server": {"host": "h", "port": "8443"}}, "server.port", "integer"),
        ("port bool", {"server": {"host": "h", "port": True}}, "server.port", "integer"),
        ("port range", {"server": {"host": "h", "port": 70000}}, "server.port", "at most 65535"),
        (
            "host unspecified",
            {"server": {"host": "0.0.0.0", "port": 1}},
            "server.host",
            "cannot be dialled",
        ),
        (
            "host invalid",
            {"server": {"host": "fl_example.org", "port": 1}},
            "server.host",
            "not a host name or IP address",
        ),
        (
            "listen host",
            {"server": {"host": "h", "port": 1, "listen": {"host": "eth0"}}},
            "server.listen.host",
            "not an IP address to listen on",
        ),
        ("project name", {"name": "Pathology"}, "name", "not a valid project name"),
        ("sites not a list", {"sites": {"a": 1}}, "sites", "must be a list"),
    ],
)
def test_structural_rules(
    example: dict[str, Any], section: str, doc_patch: dict[str, Any], path: str, expected: str
) -> None:
    example.update(doc_patch)
    found = problems(example)
    assert path in found, f"{section}: {found}"
    assert expected in found[path], f"{section}: {found[path]}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Hospital-A", "not a valid site name"),
        ("hospital_a", "not a valid site name"),
        ("-a", "not a valid site name"),
        ("a" * 64, "not a valid site name"),
        ("server", "reserved"),
        ("ca", "reserved"),
    ],
)
def test_site_names_are_rfc1123_labels(example: dict[str, Any], name: str, expected: str) -> None:
    example["sites"].append({"name": name, "org": "o"})
    assert expected in problems(example)["sites[3].name"]


def test_a_site_name_of_63_characters_is_valid(example: dict[str, Any]) -> None:
    example["sites"].append({"name": "a" * 63, "org": "o"})
    assert parse_project(example).sites[3].name == "a" * 63


@pytest.mark.parametrize("name", ["admin", "a@", "@b.org", ".a@b.org", "a b@c.org", "a@b..org"])
def test_user_names_are_email_like(example: dict[str, Any], name: str) -> None:
    example["users"][0]["name"] = name
    found = problems(example)
    assert "not a valid user name" in found["users[0].name"]


@pytest.mark.parametrize("org", ["", " lead", "a/b", "x" * 65])
def test_orgs_are_checked(example: dict[str, Any], org: str) -> None:
    example["sites"][0]["org"] = org
    assert "not a valid org" in problems(example)["sites[0].org"]


def test_roles_are_checked(example: dict[str, Any]) -> None:
    example["users"][0]["role"] = "owner"
    message = problems(example)["users[0].role"]
    assert message == "must be one of 'project_admin', 'org_admin', 'lead' or 'member', not 'owner'"


def test_names_are_unique_across_server_sites_and_users(example: dict[str, Any]) -> None:
    example["sites"].append({"name": "hospital-b", "org": "x"})
    example["users"].append({"name": "Admin@Consortium.org", "org": "x", "role": "member"})
    example["server"]["name"] = "university"
    found = problems(example)
    assert found["sites[3].name"] == (
        "'hospital-b' is already used by sites[1].name; names must be unique"
    )
    assert "already used by users[0].name" in found["users[2].name"]
    assert "already used by server.name" in found["sites[2].name"]


@pytest.mark.parametrize(
    ("study", "expected"),
    [
        ("default", "'default' is reserved; choose another study name"),
        ("Pathology", "not a valid study name"),
        ("-x", "not a valid study name"),
        ("x" * 64, "not a valid study name"),
    ],
)
def test_study_names(example: dict[str, Any], study: str, expected: str) -> None:
    example["studies"][study] = {}
    assert expected in problems(example)[f"studies.{study}"]


def test_study_names_may_use_underscores(example: dict[str, Any]) -> None:
    example["studies"]["a_b-1"] = {}
    assert "a_b-1" in parse_project(example).studies


def test_study_members_must_be_provisioned_and_listed_once(example: dict[str, Any]) -> None:
    example["studies"]["pathology"] = {
        "sites": ["hospital-a", "clinic", "hospital-a", "server"],
        "admins": ["nobody@x.org", "admin@consortium.org", "hospital-a"],
        "owner": "x",
    }
    found = problems(example)
    assert found["studies.pathology.sites[1]"] == (
        "'clinic' is not a provisioned site; add it to `sites` first"
    )
    assert found["studies.pathology.sites[2]"] == "'hospital-a' is listed twice"
    assert "not a provisioned site" in found["studies.pathology.sites[3]"]
    assert found["studies.pathology.admins[0]"] == (
        "'nobody@x.org' is not a provisioned user; add it to `users` first"
    )
    assert "not a provisioned user" in found["studies.pathology.admins[2]"]
    assert "unknown key; allowed keys: sites, admins" in found["studies.pathology.owner"]
    assert "studies.pathology.admins[1]" not in found


def test_a_document_that_is_not_a_mapping() -> None:
    assert "expected a mapping" in problems(["name"])[""]


def test_load_project_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "project.yaml"
    path.write_text("name: p\nserver: {host: localhost, port: 8443}\nsites: [{name: a, org: o}]\n")
    assert load_project(path).sites[0].name == "a"


def test_duplicate_yaml_keys_are_errors_not_silently_merged(tmp_path: Path) -> None:
    path = tmp_path / "project.yaml"
    path.write_text(
        "name: p\nserver: {host: localhost, port: 8443}\n"
        "studies:\n  s: {sites: []}\n  s: {admins: []}\n"
    )
    with pytest.raises(ProjectError) as info:
        load_project(path)
    assert "duplicate key 's' (line 5)" in str(info.value)
    assert info.value.source == str(path)


def test_invalid_yaml_and_missing_file_are_project_errors(tmp_path: Path) -> None:
    path = tmp_path / "project.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ProjectError, match="not valid YAML"):
        load_project(path)
    with pytest.raises(ProjectError, match="cannot read the file"):
        load_project(tmp_path / "missing.yaml")


def test_a_yaml_error_message_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nserver: {host: localhost, port: 8443}\nusers: [{name: x}]\n")
    with pytest.raises(ProjectError) as info:
        load_project(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 3 problems")
    assert "users[0].name: 'x' is not a valid user name" in text
    assert "users[0].org: required key is missing" in text
    assert "users[0].role: required key is missing" in text

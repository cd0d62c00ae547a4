"""schedulerd/namespaces.py: which namespace a request is in, and what a token limited to
some namespaces is told when it asks for another."""
from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from schedulerd import auth, namespaces
from schedulerd.errors import NotFound

TEAM = auth.Principal("payments-deployer", frozenset({"scheduler"}), frozenset({"payments", "billing"}))


def request(principal: auth.Principal, namespace: str | None = None):
    headers = {} if namespace is None else {namespaces.HEADER: namespace}
    req = make_mocked_request("GET", "/v1/jobs", headers=headers)
    req[auth.PRINCIPAL] = principal
    return req


def test_a_limited_token_without_the_header_is_told_which_header_to_send() -> None:
    with pytest.raises(NotFound) as refused:
        namespaces.of_request(request(TEAM))
    assert str(refused.value) == ("this token may not use the 'default' namespace, which a request without an "
                                  "X-Namespace header is in: send X-Namespace with one of billing, payments")


def test_another_namespace_is_not_found_as_a_missing_one_is() -> None:
    with pytest.raises(NotFound, match="^no namespace 'ops'$"):
        namespaces.of_request(request(TEAM, "ops"))
    assert namespaces.of_request(request(TEAM, "billing")) == "billing"
    assert namespaces.of_request(request(auth.OPEN)) == namespaces.DEFAULT

"""schemathesis against the console's OpenAPI: generated requests to every route, with an
admin token and with none. Invariants: no request makes the server fail (5xx), and every
mutating route refuses a request without a token (401) before anything happens."""

from __future__ import annotations

from datetime import timedelta

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.http.app import create_app
from ledger import Ledger
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role


def test_openapi__no_server_errors_and_no_anonymous_changes(ledger: Ledger) -> None:
    """Each generated request, sent with an admin token, never answers 5xx; sent without a
    token, a mutating one answers 401. (Cases are drawn per operation with hypothesis: the
    schemathesis pytest plugin does not run on this pytest.)"""
    secret = ledger.create_token(
        TokenRequest("fuzz", Role.ADMIN, "default", timedelta(hours=1))).secret
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", create_app(ledger))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    mutating = sum(op.method.upper() == "POST" for op in operations)
    assert mutating >= 10

    @given(data=st.data())
    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    def every_operation(data: st.DataObject) -> None:
        for operation in operations:
            case = data.draw(operation.as_strategy())
            answered = case.call(headers={"Authorization": f"Bearer {secret}"})
            assert answered.status_code < 500, (case.method, case.formatted_path,
                                                answered.text)
            if case.method.upper() == "POST":
                anonymous = case.call(headers={"Authorization": ""})
                assert anonymous.status_code == 401, (case.method, case.formatted_path,
                                                      anonymous.status_code)

    every_operation()

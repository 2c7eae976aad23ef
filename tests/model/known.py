"""Known failures of main, switched off until their fixes land.

Each flag turns off one behaviour of the model-based test (a rule, or the cases of an
invariant that one open bug breaks), so the test keeps guarding everything else in CI. Each
finding (F-number, from the review of issue 10) is described at its flag with the issue
item it waits for.
Delete a flag when its fix lands (and the test passes without it).

``ONWARD_MODEL_KNOWN=check`` ignores every flag: the test then checks everything, to see
whether the known failures still fail.
"""

from __future__ import annotations

import os

CHECK_EVERYTHING = os.environ.get("ONWARD_MODEL_KNOWN", "") == "check"

# F7 (issue 10 item 7, a design question): a model call whose answer is lost on the way
# (billed by the provider, never heard by the worker) is not debited, so a run can spend
# one call more than its budget per lost answer. Off: the budget check counts the calls
# whose answers reached the worker (all answers heard are debited, NUL ones included).
LOST_MODEL_ANSWERS_UNCOUNTED = not CHECK_EVERYTHING

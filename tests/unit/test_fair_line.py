"""The fair line's rules (agent/leases/fairness.py through policy.grant): priorities,
aging, per-user limits, fair share, and the policy file's format. Pure: records in,
answers out, some as properties over many lines (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.leases import fairness, policy
from orchestrator.agent.leases.fairness import Rules

ALICE, BOB, CAROL = 4011, 4012, 4013
NAMES = {"alice": ALICE, "bob": BOB, "carol": CAROL}
MINUTE = 60.0


def ticket(
    name: str, when: float, uid: int, count: int = 1, priority: str = "normal", **extra: object
) -> policy.Record:
    """A ticket as storage.scan gives it: `order` is its checked line time."""
    return {
        "name": name,
        "ticket": [when, name],
        "order": when,
        "count": count,
        "kind": "slot",
        "job": name,
        "uid": uid,
        "user": {v: k for k, v in NAMES.items()}.get(uid, str(uid)),
        "priority": priority,
        **extra,
    }


def lease(name: str, units: list[int], uid: int) -> policy.Record:
    return {"name": name, "units": units, "kind": "slot", "job": name, "uid": uid, "since": 0}


def request(count: int = 1, pool: int = 4) -> policy.Record:
    return {"kind": "slot", "pool": list(range(pool)), "count": count}


def rules(text: str) -> Rules:
    parsed, warnings = fairness.parse_policy(text, "/etc/orch/policy", NAMES.get)
    assert warnings == []
    return parsed


HIGH_FOR_ALL = rules("high *")


def first_granted(
    tickets: list[policy.Record], leases: list[policy.Record], now: float, given: Rules, pool: int
) -> str | None:
    """Which of the waiting tickets takes the one free unit now (one unit each)."""
    for mine in tickets:
        if policy.grant(request(1, pool), mine, leases, tickets, {}, now, given) is not None:
            return str(mine["name"])
    return None


# ---------------------------------------------------------------- priorities


def test_a_high_ticket_passes_an_older_waiting_normal_one() -> None:
    normal, high = ticket("T-n", 100.0, ALICE), ticket("T-h", 110.0, BOB, priority="high")
    held = [lease("L-x", [0, 1, 2], CAROL)]  # one unit free
    line = [normal, high]
    assert policy.grant(request(), high, held, line, {}, 120.0, HIGH_FOR_ALL) == [3]
    assert policy.grant(request(), normal, held, line, {}, 120.0, HIGH_FOR_ALL) is None


def test_a_high_ticket_never_takes_a_unit_a_running_job_holds() -> None:
    high = ticket("T-h", 100.0, BOB, count=2, priority="high")
    held = [lease("L-x", [0, 1, 2], ALICE)]
    assert policy.grant(request(2), high, held, [high], {}, 5000.0, HIGH_FOR_ALL) is None


def test_a_high_ticket_of_a_user_the_policy_does_not_name_is_read_as_normal() -> None:
    normal, high = ticket("T-n", 100.0, ALICE), ticket("T-h", 110.0, BOB, priority="high")
    only_alice = rules("high alice")
    held = [lease("L-x", [0, 1, 2], CAROL)]
    assert fairness.priority_of(high, only_alice) == "normal"
    assert policy.grant(request(), high, held, [normal, high], {}, 120.0, only_alice) is None
    assert policy.grant(request(), normal, held, [normal, high], {}, 120.0, only_alice) == [3]
    assert fairness.priority_of(high, Rules()) == "normal"  # no policy: high for nobody


def test_a_low_ticket_waits_behind_a_younger_normal_one() -> None:
    low, normal = ticket("T-l", 100.0, ALICE, priority="low"), ticket("T-n", 110.0, BOB)
    held = [lease("L-x", [0, 1, 2], CAROL)]
    assert first_granted([low, normal], held, 120.0, Rules(), 4) == "T-n"


def test_waiting_raises_a_low_ticket_one_level_per_age() -> None:
    every_minute = rules("age 1")
    low = ticket("T-l", 0.0, ALICE, priority="low")
    assert [fairness.level(low, every_minute, t) for t in (0, 59, 60, 119, 120, 600)] == [
        0,
        0,
        1,
        1,
        2,
        10,
    ]
    assert fairness.level(low, every_minute, None) == 0  # no clock: no aging
    assert fairness.level(ticket("T-f", 50.0, BOB), every_minute, 0.0) == 1  # never below


def test_a_low_ticket_passes_normal_ones_that_came_an_age_after_it() -> None:
    every_minute = rules("age 1")
    low = ticket("T-l", 0.0, ALICE, priority="low")
    late = ticket("T-n", 61.0, BOB)
    held = [lease("L-x", [0, 1, 2], CAROL)]
    assert first_granted([low, late], held, 62.0, every_minute, 4) == "T-l"
    for now in (62.0, 100.0, 3600.0):  # never passed by one that came an age after it
        assert first_granted([low, late], held, now, every_minute, 4) == "T-l"
    early = ticket("T-e", 30.0, BOB)  # came less than an age after it: ahead at times
    assert first_granted([low, early], held, 95.0, every_minute, 4) == "T-e"


# ---------------------------------------------------------------- fair share


def test_between_users_of_one_priority_the_one_who_holds_less_goes_first() -> None:
    alice_more = [lease("L-a", [0, 1], ALICE), lease("L-b", [2], BOB)]
    older, younger = ticket("T-a", 100.0, ALICE), ticket("T-b", 110.0, BOB)
    assert first_granted([older, younger], alice_more, 120.0, Rules(), 4) == "T-b"


def test_between_users_who_hold_as_much_the_older_ticket_goes_first() -> None:
    even = [lease("L-a", [0], ALICE), lease("L-b", [1], BOB), lease("L-c", [2], CAROL)]
    older, younger = ticket("T-a", 110.0, ALICE), ticket("T-b", 100.0, BOB)
    assert first_granted([older, younger], even, 120.0, Rules(), 4) == "T-b"


def test_a_higher_priority_goes_before_a_user_who_holds_less() -> None:
    held = [lease("L-a", [0, 1], ALICE), lease("L-c", [2], CAROL)]
    high = ticket("T-a", 110.0, ALICE, priority="high")
    normal = ticket("T-b", 100.0, BOB)
    assert first_granted([normal, high], held, 120.0, HIGH_FOR_ALL, 4) == "T-a"


def test_a_ticket_of_several_nodes_goes_after_every_user_of_its_level_so_claiming_it_never_helps() -> (
    None
):
    held = [lease("L-a", [0, 1], ALICE), lease("L-c", [2], CAROL)]
    several = ticket("T-s", 100.0, BOB, several=True)
    heavy = ticket("T-a", 110.0, ALICE)
    assert first_granted([several, heavy], held, 120.0, Rules(), 4) == "T-a"
    # Two jobs of several nodes wait in one order on every host, whatever each holds.
    other = ticket("T-t", 90.0, CAROL, several=True)
    for leases in (held, [lease("L-b", [0, 1, 2], BOB)]):
        order = policy.line_order([several, other], leases, 120.0)
        assert [t["name"] for t in order] == ["T-t", "T-s"]


# ---------------------------------------------------------------- limits


def test_a_user_at_their_limit_waits_while_another_users_younger_job_starts() -> None:
    two_each = rules("limit * slots 2")
    held = [lease("L-a", [0, 1], ALICE)]
    alice, bob = ticket("T-a", 100.0, ALICE), ticket("T-b", 110.0, BOB)
    assert policy.grant(request(), alice, held, [alice, bob], {}, 120.0, two_each) is None
    assert policy.grant(request(), bob, held, [alice, bob], {}, 120.0, two_each) == [2]
    info = policy.why_waiting(request(), alice, held, [alice, bob], {}, 120.0, two_each)
    assert info["limit"] == {"user": "alice", "held": 2, "most": 2}


def test_a_users_own_line_wins_over_the_line_for_everyone() -> None:
    given = rules("limit * gpus 1\nlimit alice gpus 4\nlimit 4012 slots 3")
    assert (given.limit(ALICE, "gpu"), given.limit(BOB, "gpu"), given.limit(CAROL, "gpu")) == (
        4,
        1,
        1,
    )
    assert (given.limit(BOB, "slot"), given.limit(ALICE, "slot")) == (3, None)


def test_a_users_tickets_together_stay_within_the_limit() -> None:
    three = rules("limit alice slots 3")
    first, second = ticket("T-1", 100.0, ALICE, count=2), ticket("T-2", 110.0, ALICE, count=2)
    line = [first, second]
    assert policy.grant(request(2), first, [], line, {}, 120.0, three) == [0, 1]
    assert policy.grant(request(2), second, [], line, {}, 120.0, three) is None


# ---------------------------------------------------------------- properties

units = st.lists(st.integers(0, 7), max_size=8, unique=True)
priorities = st.sampled_from(fairness.PRIORITIES)


@st.composite
def lines(draw: st.DrawFn) -> tuple[list[policy.Record], list[policy.Record], list[policy.Record]]:
    """Leases on disjoint units of an 8-unit host, and tickets of three users."""
    taken = draw(units)
    owners = draw(st.lists(st.sampled_from([ALICE, BOB, CAROL]), min_size=len(taken)))
    leases = [lease(f"L-{u}", [u], uid) for u, uid in zip(taken, owners, strict=False)]
    tickets = [
        ticket(f"T-{i}", when, uid, count, prio, several=several)
        for i, (when, uid, count, prio, several) in enumerate(
            draw(
                st.lists(
                    st.tuples(
                        st.floats(0, 10_000),
                        st.sampled_from([ALICE, BOB, CAROL]),
                        st.integers(1, 4),
                        priorities,
                        st.booleans(),
                    ),
                    min_size=1,
                    max_size=6,
                )
            )
        )
    ]
    return leases, tickets, tickets[: draw(st.integers(1, len(tickets)))]


@settings(max_examples=300, deadline=None)
@given(lines(), st.floats(0, 20_000), st.sampled_from(["", "high *", "high *\nlimit * slots 3"]))
def test_no_ticket_is_ever_granted_a_unit_that_a_live_lease_holds(
    drawn: tuple[list[policy.Record], list[policy.Record], list[policy.Record]],
    now: float,
    text: str,
) -> None:
    leases, tickets, _ = drawn
    given_rules = rules(text)
    held = {u for lease_ in leases for u in lease_["units"]}
    for mine in tickets:
        want = request(int(mine["count"]), 8)
        granted = policy.grant(want, mine, leases, tickets, {}, now, given_rules)
        if granted is not None:
            assert len(granted) == mine["count"] and not held & set(granted)
            most = given_rules.limit(mine["uid"], "slot")
            owned = sum(len(x["units"]) for x in leases if x["uid"] == mine["uid"])
            assert most is None or owned + len(granted) <= most


@settings(max_examples=300, deadline=None)
@given(lines(), st.floats(0, 20_000))
def test_the_first_ticket_in_the_line_is_never_kept_back_by_another(
    drawn: tuple[list[policy.Record], list[policy.Record], list[policy.Record]], now: float
) -> None:
    """The head of the line takes whenever enough units are free (no limits)."""
    leases, tickets, _ = drawn
    head = policy.line_order(tickets, leases, now, HIGH_FOR_ALL)[0]
    held = {u for lease_ in leases for u in lease_["units"]}
    enough = 8 - len(held) >= int(head["count"])
    granted = policy.grant(
        request(int(head["count"]), 8), head, leases, tickets, {}, now, HIGH_FOR_ALL
    )
    assert (granted is not None) == enough


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),  # a normal job arrives every this many minutes
    st.integers(1, 10),  # each runs this many minutes
    st.integers(1, 3),  # units of the host
    st.integers(1, 30),  # minutes a ticket waits to rise one level
)
def test_a_low_job_starts_within_a_bound_under_a_steady_stream_of_normal_ones(
    every: int, runs: int, pool: int, age: int
) -> None:
    """A minute at a time: a normal job of one unit arrives every `every` minutes
    (more than the host can run when `runs` > `every` * `pool`), each runs `runs`
    minutes; a low job arrives at minute 5. It starts within three ages plus what the
    jobs that came before it need: it never waits for ever."""
    given_rules = rules(f"age {age}")
    low = ticket("T-low", 5 * MINUTE, ALICE, priority="low")
    waiting, running = [low], []  # running: (ends at, lease)
    bound = 5 + 3 * age + (5 // every + 3 * age // every + pool) * runs + runs
    for minute in range(int(bound) + 2):
        now = minute * MINUTE
        running = [(end, held) for end, held in running if end > now]
        if minute % every == 0:
            waiting.append(ticket(f"T-{minute}", now, BOB if minute % 2 else CAROL))
        while True:
            leases = [held for _, held in running]
            line = [t for t in waiting if t["order"] <= now]
            taker = first_granted(line, leases, now, given_rules, pool)
            if taker is None:
                break
            mine = next(t for t in line if t["name"] == taker)
            units = policy.grant(request(1, pool), mine, leases, line, {}, now, given_rules)
            assert units is not None
            if taker == "T-low":
                return
            waiting.remove(mine)
            running.append((now + runs * MINUTE, lease(f"L-{taker}", units, int(mine["uid"]))))
    raise AssertionError(f"the low job did not start within {bound} minutes")


# ---------------------------------------------------------------- the policy file


def test_the_policy_files_rules_apply() -> None:
    text = """
    # the hosts of team x
    age 0.5            # minutes
    high alice 4013
    limit * gpus 4
    limit bob slots 2
    """
    given = rules(text)
    assert given.age_s == 30.0 and given.high == {ALICE, CAROL}
    assert given.limits == {(fairness.EVERYONE, "gpu"): 4, (BOB, "slot"): 2}
    assert given.may_use(ALICE, "high") and not given.may_use(BOB, "high")
    assert given.may_use(BOB, "low") and given.may_use(BOB, "normal")
    assert given.source == "/etc/orch/policy"


def test_a_bad_line_of_the_policy_is_ignored_with_a_warning_naming_it_and_the_rest_applies() -> (
    None
):
    text = (
        "limit * gpus 4\nlimit dave gpus 2\nage soon\nhigh\npriority bob\nlimit bob gpus\nhigh bob"
    )
    given, warnings = fairness.parse_policy(text, "/etc/orch/policy", NAMES.get)
    assert given.limits == {(fairness.EVERYONE, "gpu"): 4} and given.high == {BOB}
    assert given.age_s == fairness.AGE_S
    assert warnings == [
        "/etc/orch/policy:2: no user 'dave' on this host: ignored the line 'limit dave gpus 2'",
        "/etc/orch/policy:3: age takes one number of minutes above 0: ignored the line 'age soon'",
        "/etc/orch/policy:4: high names at least one user (or *): ignored the line 'high'",
        "/etc/orch/policy:5: unknown rule 'priority' (age, high, limit): ignored the line 'priority bob'",
        "/etc/orch/policy:6: write: limit USER gpus|slots N: ignored the line 'limit bob gpus'",
    ]


def test_a_ticket_with_an_unknown_priority_is_no_record() -> None:
    record = {
        "kind": "slot",
        "count": 1,
        "job": "j",
        "ticket": [1.0, "j"],
        "user": "bob",
        "uid": BOB,
        "holder": [1, 1],
        "boot": "b",
        "since": 1.0,
        "priority": "urgent",
    }
    assert policy.check_record(record, "T-x.json", BOB, 1.0) == (
        None,
        "priority is not low, normal or high",
    )
    checked, _ = policy.check_record({**record, "priority": "low"}, "T-x.json", BOB, 1.0)
    assert checked is not None and checked["priority"] == "low"
    assert policy.check_record({**record, "priority": "low", "several": 1}, "T-x.json", BOB, 1.0)[
        1
    ] == ("several is not true or false")


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10_000), st.floats(0, 50_000), st.integers(0, 3), st.integers(0, 3))
def test_no_job_that_came_two_ages_after_a_low_one_goes_first_whatever_their_users_hold(
    gap: float, waited: float, alice_holds: int, bob_holds: int
) -> None:
    """`normal` two ages later, `high` three ages later, never pass a `low` ticket
    (one and two ages later where both users hold as much)."""
    age = MINUTE
    held = [lease(f"L-a{u}", [u], ALICE) for u in range(alice_holds)]
    held += [lease(f"L-b{u}", [4 + u], BOB) for u in range(bob_holds)]
    low = ticket("T-l", 0.0, ALICE, priority="low")
    now = 3 * age + gap + waited
    for priority, ages in (("normal", 2), ("high", 3)):
        if alice_holds == bob_holds:
            ages -= 1
        later = ticket("T-x", ages * age + gap, BOB, priority=priority)
        order = policy.line_order([later, low], held, now, rules("age 1\nhigh *"))
        assert order[0]["name"] == "T-l", (priority, ages)

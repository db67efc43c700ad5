"""Next fire times in IANA zones, across daylight-saving transitions in both directions."""

from __future__ import annotations

import datetime

import pytest

from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule

UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


def fires(schedule: str, zone: str, start: str, count: int) -> list[str]:
    parsed = CronSchedule.parse(schedule=schedule, time_zone=zone)
    instant, out = at(start), []
    for _ in range(count):
        instant = parsed.next_after(instant)
        out.append(instant.astimezone(parsed.zone).isoformat())
    return out


def fires_backwards(schedule: str, zone: str, start: str, count: int) -> list[str]:
    parsed = CronSchedule.parse(schedule=schedule, time_zone=zone)
    instant, out = at(start), []
    for _ in range(count):
        found = parsed.latest_at_or_before(instant)
        assert found is not None
        out.append(found.astimezone(parsed.zone).isoformat())
        instant = found - datetime.timedelta(microseconds=1)
    return out


def test_new_york_spring_forward_skipped_time_fires_once_at_the_shifted_instant() -> None:
    assert fires("30 2 * * *", "America/New_York", "2024-03-09T12:00:00+00:00", 3) == [
        "2024-03-10T03:30:00-04:00",
        "2024-03-11T02:30:00-04:00",
        "2024-03-12T02:30:00-04:00",
    ]


def test_new_york_fall_back_repeated_time_fires_once() -> None:
    assert fires("30 1 * * *", "America/New_York", "2024-11-02T12:00:00+00:00", 3) == [
        "2024-11-03T01:30:00-04:00",
        "2024-11-04T01:30:00-05:00",
        "2024-11-05T01:30:00-05:00",
    ]


def test_berlin_spring_forward_skipped_time_fires_once_at_the_shifted_instant() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2024-03-30T12:00:00+00:00", 2) == [
        "2024-03-31T03:30:00+02:00",
        "2024-04-01T02:30:00+02:00",
    ]


def test_berlin_fall_back_repeated_time_fires_once() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2024-10-26T12:00:00+00:00", 2) == [
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    ]


def test_every_half_hour_follows_real_time_through_the_repeated_hour() -> None:
    assert fires("*/30 * * * *", "America/New_York", "2024-11-03T04:50:00+00:00", 5) == [
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T01:30:00-05:00",
        "2024-11-03T02:00:00-05:00",
    ]


def test_every_half_hour_has_no_duplicate_after_the_spring_gap() -> None:
    assert fires("*/30 * * * *", "Europe/Berlin", "2024-03-31T00:10:00+01:00", 4) == [
        "2024-03-31T00:30:00+01:00",
        "2024-03-31T01:00:00+01:00",
        "2024-03-31T01:30:00+01:00",
        "2024-03-31T03:00:00+02:00",
    ]


def test_backwards_matches_forwards_across_transitions() -> None:
    assert fires_backwards("30 2 * * *", "America/New_York", "2024-03-11T12:00:00+00:00", 3) == [
        "2024-03-11T02:30:00-04:00",
        "2024-03-10T03:30:00-04:00",
        "2024-03-09T02:30:00-05:00",
    ]
    assert fires_backwards("*/30 * * * *", "America/New_York", "2024-11-03T01:45:00-05:00", 4) == [
        "2024-11-03T01:30:00-05:00",
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:00:00-04:00",
    ]


def test_latest_at_or_before_includes_the_instant_itself() -> None:
    parsed = CronSchedule.parse(schedule="0 9 * * *", time_zone="UTC")
    assert parsed.latest_at_or_before(at("2024-05-01T09:00:00+00:00")) == at("2024-05-01T09:00:00+00:00")


def test_six_fields_put_seconds_first() -> None:
    assert fires("15 */2 * * * *", "UTC", "2024-01-01T00:00:00+00:00", 3) == [
        "2024-01-01T00:00:15+00:00",
        "2024-01-01T00:02:15+00:00",
        "2024-01-01T00:04:15+00:00",
    ]


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", "2024-01-01T01:00:00+01:00"),
        ("@daily", "2024-01-02T00:00:00+01:00"),
        ("@weekly", "2024-01-07T00:00:00+01:00"),
        ("@monthly", "2024-02-01T00:00:00+01:00"),
        ("@yearly", "2025-01-01T00:00:00+01:00"),
    ],
)
def test_macros(macro: str, expected: str) -> None:
    assert fires(macro, "Europe/Berlin", "2024-01-01T00:00:00+01:00", 1) == [expected]


@pytest.mark.parametrize(
    ("schedule", "zone", "field", "words"),
    [
        ("61 * * * *", "UTC", "schedule", "out of range"),
        ("* * * *", "UTC", "schedule", "has 4 fields"),
        ("@fortnightly", "UTC", "schedule", "unknown macro"),
        ("0 0 31 2 *", "UTC", "schedule", "never matches"),
        ("* * * * *", "Mars/Olympus", "timeZone", "not an IANA time zone"),
    ],
)
def test_invalid_schedules_name_the_field(schedule: str, zone: str, field: str, words: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule.parse(schedule=schedule, time_zone=zone)
    assert caught.value.field == field
    assert words in caught.value.message

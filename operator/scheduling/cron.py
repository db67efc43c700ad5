"""Cron schedules in an IANA time zone, computed on local wall-clock times and mapped to instants.

croniter is given naive local times only: it walks the wall clock, and this module turns each
wall-clock slot into UTC instants by the zone's rules, so no fixed UTC offset leaks in. The rule
at daylight-saving transitions:

- spring forward (a wall time that does not exist): the slot fires once, at the shifted instant
  (the wall time read with the offset before the gap, as RFC 5545 does: 02:30 in New York's gap
  fires at 03:30 EDT);
- fall back (a wall time that happens twice): a schedule whose hour field names particular hours
  (`30 1 * * *`, `0 9-17 * * *`) fires once, at the first occurrence; a schedule that matches
  every hour (`*` or all 24 hours in the hour field, `@hourly`, `*/5 * * * *`) follows real time and
  fires in both repeated hours, as Vixie cron treats wildcard-hour jobs, so "every 10 minutes"
  never pauses for an hour. So a daily or weekly slot repeated in autumn runs once; an hourly one
  runs in each of the two hours.

Six fields put the seconds first (`s m h dom mon dow`), as Kubernetes-style tools write them.
"""

from __future__ import annotations

import datetime
import zoneinfo
from dataclasses import dataclass

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

UTC = datetime.UTC
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: Wider than any daylight-saving shift, so the instants of wall times further apart cannot cross.
_FOLD_WINDOW = datetime.timedelta(hours=3)
_TICK = datetime.timedelta(microseconds=1)


class InvalidSchedule(ValueError):
    """The schedule or time zone cannot be used; `field` names the spec field to fix."""

    def __init__(self, *, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class CronSchedule:
    """A parsed schedule: the croniter expression (seconds last), its zone, and whether it fires hourly."""

    expression: str
    zone: zoneinfo.ZoneInfo
    every_hour: bool

    @classmethod
    def parse(cls, *, schedule: str, time_zone: str) -> CronSchedule:
        """Validate both fields; `InvalidSchedule` carries croniter's or zoneinfo's own message."""
        zone = _zone(time_zone)
        text = " ".join(schedule.split())
        expression = MACROS.get(text.lower(), text)
        fields = expression.split(" ")
        if expression.startswith("@"):
            raise InvalidSchedule(
                field="schedule", message=f"unknown macro {text!r}; use one of {', '.join(sorted(MACROS))}"
            )
        if len(fields) not in (5, 6):
            raise InvalidSchedule(
                field="schedule",
                message=f"{text!r} has {len(fields)} fields; use 5 (minute hour day month weekday) or 6 (second first)",
            )
        if len(fields) == 6:
            expression = " ".join([*fields[1:], fields[0]])
        try:
            hours = croniter.expand(expression)[0][1]
            parsed = cls(expression=expression, zone=zone, every_hour=hours == ["*"] or len(hours) == 24)
            parsed.next_after(datetime.datetime(2000, 1, 1, tzinfo=UTC))
        except CroniterBadDateError:
            raise InvalidSchedule(field="schedule", message=f"{text!r} never matches a date") from None
        except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
            raise InvalidSchedule(field="schedule", message=f"{text!r} is not a valid cron expression: {exc}") from None
        return parsed

    def next_after(self, instant: datetime.datetime) -> datetime.datetime:
        """The first fire instant strictly after `instant` (UTC)."""
        wall = self._wall(instant)
        first = croniter(self.expression, wall).get_next(datetime.datetime)
        candidate = self._instants(first)[0]
        if candidate > instant and self._steady(instant) and self._steady(candidate):
            return candidate
        return self._search(instant, forward=True)

    def latest_at_or_before(self, instant: datetime.datetime) -> datetime.datetime | None:
        """The last fire instant at or before `instant` (UTC), or None if there was none in ten years."""
        wall = self._wall(instant)
        try:
            last = croniter(self.expression, wall + _TICK).get_prev(datetime.datetime)
        except CroniterBadDateError:
            return None
        candidate = self._instants(last)[-1]
        if candidate <= instant and self._steady(instant) and self._steady(candidate):
            return candidate
        return self._search(instant, forward=False)

    def due(self, *, cursor: datetime.datetime, now: datetime.datetime) -> tuple[datetime.datetime, datetime.datetime]:
        """(the slot to fire, the next cursor) when `cursor` (the next slot not yet handled) is at or before `now`:
        of several slots passed meanwhile only the latest fires, so catching up after downtime is never a burst."""
        latest = max(self.latest_at_or_before(now) or cursor, cursor)
        return latest, self.next_after(latest)

    def _search(self, instant: datetime.datetime, *, forward: bool) -> datetime.datetime | None:
        """Near a transition: walk wall-clock slots from beyond the shift and keep the closest instant."""
        wall = self._wall(instant)
        walker = croniter(self.expression, wall - _FOLD_WINDOW if forward else wall + _FOLD_WINDOW)
        floor = wall - datetime.timedelta(days=3660)
        found: datetime.datetime | None = None
        found_wall: datetime.datetime | None = None
        while True:
            try:
                slot = walker.get_next(datetime.datetime) if forward else walker.get_prev(datetime.datetime)
            except CroniterBadDateError:
                return found
            if (found_wall is not None and abs(slot - found_wall) > _FOLD_WINDOW) or slot < floor:
                return found
            for candidate in self._instants(slot):
                if forward and candidate > instant and (found is None or candidate < found):
                    found, found_wall = candidate, slot
                if not forward and candidate <= instant and (found is None or candidate > found):
                    found, found_wall = candidate, slot

    def _wall(self, instant: datetime.datetime) -> datetime.datetime:
        return instant.astimezone(self.zone).replace(tzinfo=None)

    def _steady(self, instant: datetime.datetime) -> bool:
        """Whether the zone's offset stays the same for a window around `instant` (no transition near)."""
        return (instant - _FOLD_WINDOW).astimezone(self.zone).utcoffset() == (instant + _FOLD_WINDOW).astimezone(
            self.zone
        ).utcoffset()

    def _instants(self, wall: datetime.datetime) -> list[datetime.datetime]:
        """When a local wall-clock slot fires: once normally and in a gap, once or twice in a fold."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if first < second and self.every_hour:
            return [first, second]
        # fold=0 is the first occurrence in a fold and, in a gap, the wall time read with the offset
        # before the transition: the shifted instant.
        return [first]


def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(
            field="timeZone", message=f"{name!r} is not an IANA time zone (e.g. Europe/Berlin, UTC): {exc}"
        ) from None

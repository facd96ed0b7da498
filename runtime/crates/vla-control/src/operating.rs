//! The operating point: what share of the publisher's ticks will hold the arm at a given
//! latency, and which of the loop's limits is to blame. Pure arithmetic on the settings
//! and what was measured; stated at READY, in STATUS and by `vlad plan`.
//!
//! The model, per inference cycle (times from an observation's capture, ns):
//! - a chunk lands at the first publish tick after it is ready: `L_land = L + P/2` with
//!   `L` its capture -> ready latency and `P` the publish period;
//! - it publishes `ok` until `E = min(H dt + g, A)`: its `H` rows at `dt` each plus the
//!   grace `g` (`hold_after_chunk_end`) in which its last action stays `ok`, unless
//!   `max_chunk_age` `A` refuses it first;
//! - the next chunk's observation is captured `C` (the cycle) after this one's: back to
//!   back `C = L - (age of the next observation)`; with `Trigger::Remaining` no earlier
//!   than `d + margin` steps before the chunk's end; prefix modes wait for the publisher
//!   to take the last chunk (half a tick on average); an observation older than
//!   `max_observation_age` is skipped and the next one waited for;
//! - so each cycle holds `C + L'_land - E` of its `C` (clamped to `[0, C]`), `L'` the
//!   next chunk's latency.
//!
//! Latencies vary (the emulator's by 2x under load, a board's less): the expected hold
//! averages that over every pair of this and the next chunk's latency drawn from the
//! window's deciles (their midpoints p5, p15, ..., p95), so a tail of slow inferences
//! counts.
//! The merge mode does not create steps (crossfade blends, prefix and inpaint condition
//! the same rows), so apart from the prefix wait it does not enter the share. `d` (the
//! delay in steps, what prefixes freeze and the trigger leads by) comes from the p95.
//! An `ok` action whose `action_valid` is shorter than the publish period expires before
//! the next one arrives: the arm stops for the rest of the period although nothing holds.

use crate::limits::Limits;
use crate::plan::{delay_steps, Trigger};

/// How many latencies stand for the window's spread.
pub const SPREAD_LEN: usize = 10;

/// The quantiles of the latency window the expected hold averages over: the midpoints of
/// its deciles, each standing for a tenth of the inferences.
pub const SPREAD_QUANTILES: [f64; SPREAD_LEN] =
    [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95];

/// What was measured (or is known before the loop runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// p95 capture -> chunk ready: `d` is computed from it (planning is conservative).
    pub latency_p95_ns: u64,
    /// Capture -> chunk ready at [`SPREAD_QUANTILES`]: the expected hold averages over them.
    pub latency_spread_ns: [u64; SPREAD_LEN],
    /// The robot's observation period (0: not measured yet).
    pub observation_period_ns: u64,
}

impl Measured {
    /// One latency known before the loop runs (the parity gate's warm inference).
    pub fn from_latency(latency_ns: u64) -> Self {
        Self {
            latency_p95_ns: latency_ns,
            latency_spread_ns: [latency_ns; SPREAD_LEN],
            observation_period_ns: 0,
        }
    }

    /// The median latency (between the 45th and 55th percentiles).
    pub fn p50_ns(&self) -> u64 {
        let s = &self.latency_spread_ns;
        s[SPREAD_LEN / 2 - 1] / 2 + s[SPREAD_LEN / 2] / 2
    }

    /// The slow end of the spread (its p95): what a limit must cover.
    pub fn slow_ns(&self) -> u64 {
        self.latency_spread_ns[SPREAD_LEN - 1]
    }
}

/// The limit that holds the arm most, and the setting that would remove it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// The chunk's rows (and the grace after them) run out before the next chunk lands.
    /// Removed by a chunk step rate of at most `chunk_rate_hz` (a slower time base) with
    /// `max_chunk_age` at least `max_chunk_age_ns`, or by a shorter latency.
    Schedule {
        /// Highest chunk step rate, in Hz, at which the next chunk lands before this one runs out.
        chunk_rate_hz: f64,
        /// The `max_chunk_age` that rate needs (rounded up to 10 ms).
        max_chunk_age_ns: u64,
    },
    /// `max_chunk_age` refuses rows before the next chunk lands.
    ChunkAge {
        /// The configured `max_chunk_age`.
        limit_ns: u64,
        /// The `max_chunk_age` that removes the hold (rounded up to 10 ms).
        raise_to_ns: u64,
    },
    /// Observations arrive further apart than `max_observation_age`: inferences wait for
    /// a fresh one.
    ObservationAge {
        /// The configured `max_observation_age`.
        limit_ns: u64,
        /// The robot's measured observation period.
        observation_period_ns: u64,
        /// 1.5 observation periods (rounded up to 10 ms): a `max_observation_age` that removes
        /// the wait.
        raise_to_ns: u64,
    },
    /// `action_valid` is shorter than the publish period: each action expires before
    /// the next one arrives.
    ActionValid {
        /// The configured `action_valid`.
        limit_ns: u64,
        /// An `action_valid` of 1.5 publish periods (rounded up to 10 ms).
        raise_to_ns: u64,
    },
}

/// The loop's operating point, stated at READY and in STATUS.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperatingPoint {
    /// Capture -> chunk ready at p95: what `d` is computed from.
    pub latency_ns: u64,
    /// Capture -> chunk ready at p50.
    pub typical_latency_ns: u64,
    /// Delay in chunk steps (from the p95).
    pub d: u64,
    /// Steps per chunk (`H`); `d >= H` means every chunk lands spent.
    pub horizon: u64,
    /// Expected share of publish ticks that publish `hold`.
    pub hold_share: f64,
    /// Expected share of the time an `ok` action has already expired.
    pub expired_share: f64,
    /// Highest publish rate (same publish ticks per chunk step) at which the schedule
    /// alone holds nothing.
    pub max_continuous_hz: f64,
    /// What holds the arm most (`None`: under 1% of the time held, or only the hold
    /// synchronous execution makes by design).
    pub limit: Option<Limit>,
    /// Synchronous execution: the arm holds while each inference runs, by design.
    pub synchronous: bool,
}

/// `ns` rounded up to 10 ms: the values a limit names are written into a config in ms.
fn ms10(ns: f64) -> u64 {
    ((ns / 1e7).ceil() * 1e7) as u64
}

/// Below this share of the time held, no limit is named.
const NEGLIGIBLE: f64 = 0.01;

/// The cycle model at `s` and `m`, with optional limits replaced (to see what each costs).
#[derive(Clone, Copy, Debug)]
struct Model {
    s: Limits,
    m: Measured,
}

impl Model {
    fn period(&self) -> f64 {
        self.s.period_ns.max(1) as f64
    }

    fn step(&self) -> f64 {
        self.s.chunk_period_ns.max(self.s.period_ns).max(1) as f64
    }

    fn d(&self) -> u64 {
        delay_steps(self.m.latency_p95_ns, self.step() as u64)
    }

    /// From capture until a chunk of latency `l` lands: the next tick, on average.
    fn landing(&self, l: f64) -> f64 {
        l + self.period() / 2.0
    }

    fn latencies(&self) -> impl Iterator<Item = f64> + '_ {
        self.m.latency_spread_ns.iter().map(|&l| l as f64)
    }

    fn p50(&self) -> f64 {
        self.m.p50_ns() as f64
    }

    /// Until when (after capture) the chunk publishes `ok` without a successor.
    fn usable(&self) -> f64 {
        let rows = self.s.horizon as f64 * self.step() + self.s.hold_after_chunk_end_ns as f64;
        match self.s.max_chunk_age_ns {
            0 => rows,
            a => rows.min(a as f64),
        }
    }

    /// Mean time from a chunk being ready to the next capture: minus the age of the
    /// observation taken (fresh), or waiting for the next one (too old to take).
    fn observation_gap(&self) -> f64 {
        let t = self.m.observation_period_ns as f64;
        if t == 0.0 {
            return 0.0;
        }
        let limit = match self.s.max_observation_age_ns {
            0 => f64::INFINITY,
            a => a as f64,
        };
        let fresh_limit = limit.min(t);
        let fresh = fresh_limit / t;
        -fresh * fresh_limit / 2.0 + (1.0 - fresh) * (t - fresh_limit) / 2.0
    }

    /// Capture to capture after a chunk of latency `l`.
    fn cycle(&self, l: f64) -> f64 {
        let take_wait = if self.s.merge.conditions_on_prefix() {
            self.period() / 2.0
        } else {
            0.0
        };
        let start = match self.s.trigger {
            Trigger::BackToBack => l + take_wait,
            Trigger::Remaining { margin_steps } => {
                let lead = (self.d() + u64::from(margin_steps)) as f64;
                let wait = (self.s.horizon as f64 - 1.0 - lead) * self.step();
                (l + self.period() / 2.0).max(wait)
            }
            // The executed rows from the landing, then the next observation after them.
            Trigger::Synchronous { .. } => {
                let t = self.m.observation_period_ns as f64;
                return self.landing(l) + self.executed() + t / 2.0;
            }
        };
        (start + self.observation_gap()).max(self.period())
    }

    /// Synchronous execution: how long a chunk's executed rows play.
    fn executed(&self) -> f64 {
        let rows = self
            .s
            .trigger
            .synchronous_rows(self.s.horizon as usize)
            .unwrap_or(0);
        rows as f64 * self.step()
    }

    /// Synchronous execution: each chunk plays its executed rows from its landing (those
    /// `max_chunk_age` allows), and the arm holds for the rest of the cycle.
    fn synchronous_hold_share(&self) -> f64 {
        let (mut held, mut total) = (0.0, 0.0);
        for l in self.latencies() {
            let c = self.cycle(l);
            let ok = match self.s.max_chunk_age_ns {
                0 => self.executed(),
                a => (a as f64 - self.landing(l)).clamp(0.0, self.executed()),
            };
            held += c - ok;
            total += c;
        }
        held / total
    }

    /// Held time over all time, each chunk's and the next one's latency drawn from the
    /// spread. Between two landings (`landing(l)` and `c + landing(next)` after this
    /// chunk's capture) the arm holds from the end of this chunk's rows (`e`, or its own
    /// landing if it lands spent) until the next lands. Over every pair the intervals
    /// add up to the cycles (`c + next - l`, with `next` and `l` drawn alike).
    fn hold_share(&self) -> f64 {
        if self.synchronous() {
            return self.synchronous_hold_share();
        }
        let e = self.usable();
        let (mut held, mut total) = (0.0, 0.0);
        for l in self.latencies() {
            let c = self.cycle(l);
            for next in self.latencies() {
                let next_lands = c + self.landing(next);
                let interval = (next_lands - self.landing(l)).max(0.0);
                held += (next_lands - e.max(self.landing(l))).clamp(0.0, interval);
                total += c;
            }
        }
        (held / total).min(1.0)
    }

    fn synchronous(&self) -> bool {
        matches!(self.s.trigger, Trigger::Synchronous { .. })
    }

    fn expired_share(&self) -> f64 {
        let v = self.s.action_valid_ns as f64;
        (1.0 - v / self.period()).max(0.0)
    }

    /// Share of the time the arm does not move on a fresh action.
    fn still(&self) -> f64 {
        let hold = self.hold_share();
        hold + (1.0 - hold) * self.expired_share()
    }

    fn with(&self, f: impl FnOnce(&mut Limits)) -> Self {
        let mut s = self.s;
        f(&mut s);
        Self { s, m: self.m }
    }

    /// The limit whose removal frees the arm most, with the value that removes it.
    fn limit(&self) -> Option<Limit> {
        let still = self.still();
        if still < NEGLIGIBLE {
            return None;
        }
        if self.synchronous() {
            // Holding while inferring is the protocol; only an age limit that refuses
            // executed rows is a limit.
            let slow = self.landing(self.m.slow_ns() as f64);
            let needed = slow + self.executed();
            let a = self.s.max_chunk_age_ns;
            return (a != 0 && (a as f64) < needed).then(|| Limit::ChunkAge {
                limit_ns: a,
                raise_to_ns: ms10(needed),
            });
        }
        let unlimited_rows = self.with(|s| {
            s.horizon = u64::MAX / 2;
            s.max_chunk_age_ns = 0;
        });
        let any_observation = self.with(|s| s.max_observation_age_ns = 0);
        let any_valid = self.with(|s| s.action_valid_ns = u64::MAX / 2);
        let gains = [
            still - unlimited_rows.still(),
            still - any_observation.still(),
            still - any_valid.still(),
        ];
        // On a tie the more specific limit wins: removing the rows' end frees the arm
        // from anything, so it only counts when it gains more than the others.
        let best = [1, 2, 0]
            .into_iter()
            .fold(1, |best, i| if gains[i] > gains[best] { i } else { best });
        if gains[best] < NEGLIGIBLE {
            return None;
        }
        // Until the next chunk lands, at the spread's slow end (a limit set to the median
        // would still hold the slower half of the cycles).
        let slow = self.m.slow_ns() as f64;
        let needed = self.landing(slow) + self.cycle(slow);
        Some(match best {
            0 => {
                let rows =
                    self.s.horizon as f64 * self.step() + self.s.hold_after_chunk_end_ns as f64;
                let age = self.s.max_chunk_age_ns as f64;
                if self.s.max_chunk_age_ns != 0 && age < rows.min(needed) {
                    Limit::ChunkAge {
                        limit_ns: self.s.max_chunk_age_ns,
                        raise_to_ns: ms10(needed.min(rows)),
                    }
                } else {
                    let span = (needed - self.s.hold_after_chunk_end_ns as f64).max(1.0);
                    Limit::Schedule {
                        chunk_rate_hz: self.s.horizon as f64 / (span / 1e9),
                        max_chunk_age_ns: ms10(needed),
                    }
                }
            }
            1 => Limit::ObservationAge {
                limit_ns: self.s.max_observation_age_ns,
                observation_period_ns: self.m.observation_period_ns,
                raise_to_ns: ms10(self.m.observation_period_ns as f64 * 1.5),
            },
            _ => Limit::ActionValid {
                limit_ns: self.s.action_valid_ns,
                raise_to_ns: ms10(self.period() * 1.5),
            },
        })
    }

    /// The highest publish rate, with the same publish ticks per chunk step, at which the
    /// rows and grace cover the cycle: `H k P + g >= L + P/2 + C` with `P = 1 / rate`.
    fn max_continuous_hz(&self) -> f64 {
        let per_step = self.step() / self.period();
        let span = self.p50() + self.cycle(self.p50()) - self.s.hold_after_chunk_end_ns as f64;
        if span <= 0.0 {
            return f64::INFINITY;
        }
        (self.s.horizon as f64 * per_step - 0.5).max(0.0) / (span / 1e9)
    }
}

impl OperatingPoint {
    /// The operating point of `settings` at `measured` (`None` without a latency).
    pub fn estimate(settings: &Limits, measured: &Measured) -> Option<Self> {
        if measured.latency_p95_ns == 0 {
            return None;
        }
        let mut m = *measured;
        if m.latency_spread_ns.contains(&0) {
            m.latency_spread_ns = [m.latency_p95_ns; SPREAD_LEN];
        }
        let model = Model { s: *settings, m };
        Some(Self {
            latency_ns: m.latency_p95_ns,
            typical_latency_ns: m.p50_ns(),
            d: model.d(),
            horizon: settings.horizon,
            hold_share: model.hold_share(),
            expired_share: model.expired_share(),
            max_continuous_hz: model.max_continuous_hz(),
            limit: model.limit(),
            synchronous: model.synchronous(),
        })
    }

    /// `d >= H`: every chunk lands already spent.
    pub fn spent_on_arrival(&self) -> bool {
        self.d >= self.horizon
    }

    /// Whether the line deserves a warning: chunks land spent, or the arm holds half the
    /// time or more.
    pub fn warrants_warning(&self) -> bool {
        if self.synchronous {
            return self.limit.is_some();
        }
        self.spent_on_arrival() || self.hold_share >= 0.5 || self.expired_share >= 0.5
    }

    /// One line for READY / STATUS.
    pub fn describe(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut s = format!(
            "operating point: latency p95 {:.0} ms (p50 {:.0}), d {} of H {} steps, expected hold {:.0}%",
            ms(self.latency_ns),
            ms(self.typical_latency_ns),
            self.d,
            self.horizon,
            self.hold_share * 100.0,
        );
        if self.expired_share > 0.0 {
            s.push_str(&format!(
                ", ok actions expired {:.0}% of the time",
                self.expired_share * 100.0
            ));
        }
        if self.synchronous {
            s.push_str(", synchronous: the arm holds while each inference runs");
        } else {
            s.push_str(&format!(
                ", continuous up to {:.1} Hz",
                self.max_continuous_hz
            ));
        }
        if self.synchronous {
            if self.warrants_warning() {
                s.push_str(" -- WARNING");
            }
        } else if self.spent_on_arrival() {
            s.push_str(" -- WARNING: d >= H, every chunk arrives spent");
        } else if self.warrants_warning() {
            s.push_str(" -- WARNING: the arm holds half the time or more");
        }
        match self.limit {
            None => {}
            Some(Limit::Schedule {
                chunk_rate_hz,
                max_chunk_age_ns,
            }) => s.push_str(&format!(
                "; held by the schedule: the chunk's rows run out before the next chunk lands: \
                 lower control.publish_hz or set control.chunk_rate_hz to at most {:.1} \
                 (with control.max_chunk_age_ms at least {:.0})",
                (chunk_rate_hz * 10.0).floor() / 10.0,
                ms(max_chunk_age_ns)
            )),
            Some(Limit::ChunkAge {
                limit_ns,
                raise_to_ns,
            }) => s.push_str(&format!(
                "; held by control.max_chunk_age_ms {:.0}: it refuses rows older than that before \
                 the next chunk lands: raise it to {:.0} or shorten the latency",
                ms(limit_ns),
                ms(raise_to_ns)
            )),
            Some(Limit::ObservationAge {
                limit_ns,
                observation_period_ns,
                raise_to_ns,
            }) => s.push_str(&format!(
                "; held by control.max_observation_age_ms {:.0}: observations come every {:.0} ms, \
                 so inferences wait for a fresh one: raise it to {:.0}",
                ms(limit_ns),
                ms(observation_period_ns),
                ms(raise_to_ns)
            )),
            Some(Limit::ActionValid {
                limit_ns,
                raise_to_ns,
            }) => s.push_str(&format!(
                "; held by control.action_valid_ms {:.0}: shorter than the publish period, each action \
                 expires before the next: raise it to {:.0}",
                ms(limit_ns),
                ms(raise_to_ns)
            )),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MergeMode;

    const MS: u64 = 1_000_000;

    /// 20 Hz, H = 10, no age limits, a grace of 0, actions valid 100 ms.
    fn settings() -> Limits {
        Limits {
            period_ns: 50 * MS,
            chunk_period_ns: 50 * MS,
            horizon: 10,
            merge: MergeMode::Skip,
            trigger: Trigger::BackToBack,
            max_chunk_age_ns: 0,
            max_observation_age_ns: 0,
            action_valid_ns: 100 * MS,
            hold_after_chunk_end_ns: 0,
        }
    }

    fn at(s: &Limits, latency_ms: u64) -> OperatingPoint {
        OperatingPoint::estimate(s, &Measured::from_latency(latency_ms * MS)).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn no_latency_no_point() {
        assert_eq!(
            OperatingPoint::estimate(&settings(), &Measured::default()),
            None
        );
    }

    #[test]
    fn the_schedule_alone_holds_what_the_rows_do_not_cover() {
        // 200 ms at 20 Hz, H = 10: lands at 225 ms, rows to 500 ms, next lands at 425.
        let p = at(&settings(), 200);
        assert_eq!((p.d, p.hold_share, p.limit), (4, 0.0, None));
        assert!(!p.warrants_warning());
        // 350 ms: lands at 375, rows to 500 (125 of a 350 ms cycle ok).
        let p = at(&settings(), 350);
        assert_eq!(p.d, 7);
        assert!(close(p.hold_share, 1.0 - 125.0 / 350.0), "{}", p.hold_share);
        // A rate of 10 steps over 350 + 375 ms removes it, with an age limit to match.
        let Some(Limit::Schedule {
            chunk_rate_hz,
            max_chunk_age_ns,
        }) = p.limit
        else {
            panic!("{:?}", p.limit);
        };
        assert!(close(chunk_rate_hz, 10.0 / 0.725), "{chunk_rate_hz}");
        assert_eq!(max_chunk_age_ns, 730 * MS);
        // 650 ms: d = 13 >= H, every chunk spent: all hold, and the warning says so.
        let p = at(&settings(), 650);
        assert!(p.spent_on_arrival() && p.hold_share == 1.0);
        assert!(p.describe().contains("WARNING: d >= H"), "{}", p.describe());
        assert!(p.describe().contains("chunk_rate_hz to at most"));
    }

    #[test]
    fn the_grace_after_the_last_row_covers_part_of_the_gap() {
        let s = Limits {
            hold_after_chunk_end_ns: 100 * MS,
            ..settings()
        };
        // 350 ms: rows and grace to 600, lands at 375: 225 of 350 ok.
        assert!(close(at(&s, 350).hold_share, 1.0 - 225.0 / 350.0));
    }

    #[test]
    fn the_chunk_age_limit_refuses_rows_before_the_next_chunk_lands() {
        // A reported case (READY said 33% hold, the robot measured 84%): 20 Hz,
        // chunk_rate_hz 4 (250 ms steps), H = 10, 1.5 s.
        let s = Limits {
            chunk_period_ns: 250 * MS,
            max_chunk_age_ns: 1500 * MS,
            hold_after_chunk_end_ns: 100 * MS,
            ..settings()
        };
        let p = at(&s, 1500);
        assert_eq!(p.d, 6);
        // Lands at 1525 ms, refused after 1500: every tick holds.
        assert_eq!(p.hold_share, 1.0);
        assert_eq!(
            p.limit,
            Some(Limit::ChunkAge {
                limit_ns: 1500 * MS,
                raise_to_ns: 2600 * MS
            }),
            "rows (2500) + grace (100) end before the next landing (3025): raising past 2600 gains nothing"
        );
        assert!(
            p.describe().contains("max_chunk_age_ms 1500"),
            "{}",
            p.describe()
        );
        // Raised as the line says: only the schedule is left (2600 - 1525 of 1500 ok).
        let raised = at(
            &Limits {
                max_chunk_age_ns: 2600 * MS,
                ..s
            },
            1500,
        );
        assert!(close(raised.hold_share, 1.0 - 1075.0 / 1500.0));
        assert!(matches!(raised.limit, Some(Limit::Schedule { .. })));
        // At 1.2 s the same settings are continuous once the age limit allows them.
        let fast = at(
            &Limits {
                max_chunk_age_ns: 6000 * MS,
                ..s
            },
            1200,
        );
        assert_eq!((fast.hold_share, fast.limit), (0.0, None));
        assert!(
            at(&s, 1200).hold_share > 0.5,
            "1500 ms refuses them at 1.2 s too"
        );
    }

    #[test]
    fn an_observation_age_limit_below_the_robot_period_lengthens_the_cycle() {
        let s = Limits {
            max_observation_age_ns: 40 * MS,
            ..settings()
        };
        let m = |period_ms: u64| Measured {
            observation_period_ns: period_ms * MS,
            ..Measured::from_latency(350 * MS)
        };
        // 100 ms observations, 40 ms allowed: 40% taken (20 ms old on average), 60% wait
        // 30 ms on average for the next: the cycle is 350 - 8 + 18 = 360 ms.
        let p = OperatingPoint::estimate(&s, &m(100)).unwrap();
        assert!(close(p.hold_share, 1.0 - 125.0 / 360.0), "{}", p.hold_share);
        // Without the limit the cycle is 300 ms (half a period shorter than L).
        let free = OperatingPoint::estimate(
            &Limits {
                max_observation_age_ns: 0,
                ..s
            },
            &m(100),
        )
        .unwrap();
        assert!(close(free.hold_share, 1.0 - 125.0 / 300.0));
        // Dominant where the rows cover the cycle only without it: H = 14 (700 ms rows,
        // 325 left after landing, cycle 300 free vs 360 limited).
        let h14 = Limits { horizon: 14, ..s };
        let p = OperatingPoint::estimate(&h14, &m(100)).unwrap();
        assert_eq!(
            p.limit,
            Some(Limit::ObservationAge {
                limit_ns: 40 * MS,
                observation_period_ns: 100 * MS,
                raise_to_ns: 150 * MS
            })
        );
        assert!(p.describe().contains("max_observation_age_ms 40"));
        // Observations every 20 ms: the limit never refuses one, so it is not named.
        let quick = OperatingPoint::estimate(&h14, &m(20)).unwrap();
        assert!(
            matches!(quick.limit, Some(Limit::Schedule { .. })),
            "{:?}",
            quick.limit
        );
    }

    #[test]
    fn an_action_valid_shorter_than_the_period_expires_between_ticks() {
        let s = Limits {
            action_valid_ns: 30 * MS,
            ..settings()
        };
        let p = at(&s, 200);
        assert_eq!(p.hold_share, 0.0);
        assert!(close(p.expired_share, 0.4));
        assert_eq!(
            p.limit,
            Some(Limit::ActionValid {
                limit_ns: 30 * MS,
                raise_to_ns: 80 * MS
            })
        );
        assert!(p.describe().contains("expired 40%"), "{}", p.describe());
    }

    #[test]
    fn the_remaining_trigger_waits_until_d_plus_margin_steps_are_left() {
        // 32 steps of 50 ms, 200 ms (d = 4), margin 2: starts 25 steps after the capture,
        // the next lands at 1250 + 225 = 1475 < 1600: nothing holds, the NPU idles.
        let s = Limits {
            horizon: 32,
            trigger: Trigger::Remaining { margin_steps: 2 },
            ..settings()
        };
        assert_eq!(at(&s, 200).hold_share, 0.0);
        // 1.2 s (d = 24 > 32 - 1 - 26): back to back after all; 1600 - 1225 of 1225 ok.
        let p = at(&s, 1200);
        assert!(
            close(p.hold_share, 1.0 - 375.0 / 1225.0),
            "{}",
            p.hold_share
        );
    }

    #[test]
    fn prefix_modes_wait_half_a_tick_for_the_take() {
        let s = Limits {
            merge: MergeMode::Inpaint,
            ..settings()
        };
        // Cycle 350 + 25 ms.
        assert!(close(at(&s, 350).hold_share, 1.0 - 125.0 / 375.0));
        assert_eq!(at(&s, 200).hold_share, 0.0);
    }

    #[test]
    fn the_typical_latency_sets_the_share_and_the_p95_sets_d() {
        let m = Measured {
            latency_p95_ns: 400 * MS,
            latency_spread_ns: [200 * MS; SPREAD_LEN],
            observation_period_ns: 0,
        };
        let p = OperatingPoint::estimate(&settings(), &m).unwrap();
        assert_eq!((p.d, p.hold_share), (8, 0.0));
        assert!(p.describe().contains("p95 400 ms (p50 200)"));
    }

    #[test]
    fn a_tail_of_slow_inferences_holds_in_the_cycles_it_slows() {
        // H = 32 (rows to 1600 ms); one latency in five at 1.3 s, the rest 300 ms. A fast
        // chunk then a slow one, or a slow one then a fast one, hold 25 ms (the next lands
        // at 1625); two slow ones 1025. Over the 10 x 10 pairs: held 16 x 25 + 16 x 25 +
        // 4 x 1025 of 8 x 10 x 300 + 2 x 10 x 1300 ms.
        let s = Limits {
            horizon: 32,
            ..settings()
        };
        let m = Measured {
            latency_p95_ns: 1300 * MS,
            latency_spread_ns: [
                300 * MS,
                300 * MS,
                300 * MS,
                300 * MS,
                300 * MS,
                300 * MS,
                300 * MS,
                300 * MS,
                1300 * MS,
                1300 * MS,
            ],
            observation_period_ns: 0,
        };
        let p = OperatingPoint::estimate(&s, &m).unwrap();
        assert!(close(p.hold_share, 4900.0 / 50000.0), "{}", p.hold_share);
        assert_eq!(
            at(&s, 300).hold_share,
            0.0,
            "the median alone holds nothing"
        );
    }

    #[test]
    fn synchronous_execution_holds_while_inferring_and_names_only_an_age_limit() {
        // 10 of 32 rows at 50 ms, 1.2 s latency, observations every 100 ms: rows play
        // 500 ms of a 1225 + 500 + 50 ms cycle.
        let s = Limits {
            horizon: 32,
            trigger: Trigger::Synchronous { execute_steps: 10 },
            ..settings()
        };
        let m = Measured {
            observation_period_ns: 100 * MS,
            ..Measured::from_latency(1200 * MS)
        };
        let p = OperatingPoint::estimate(&s, &m).unwrap();
        assert!(
            close(p.hold_share, 1.0 - 500.0 / 1775.0),
            "{}",
            p.hold_share
        );
        assert_eq!(p.limit, None, "the hold is the protocol's");
        assert!(!p.warrants_warning());
        assert!(p
            .describe()
            .contains("synchronous: the arm holds while each inference runs"));
        // An age limit of 1.5 s lets rows up to 275 ms after the landing play.
        let aged = Limits {
            max_chunk_age_ns: 1500 * MS,
            ..s
        };
        let p = OperatingPoint::estimate(&aged, &m).unwrap();
        assert!(
            close(p.hold_share, 1.0 - 275.0 / 1775.0),
            "{}",
            p.hold_share
        );
        assert_eq!(
            p.limit,
            Some(Limit::ChunkAge {
                limit_ns: 1500 * MS,
                raise_to_ns: 1730 * MS
            })
        );
        assert!(p.warrants_warning());
    }

    #[test]
    fn the_continuous_rate_keeps_the_ticks_per_step() {
        // H = 10, one tick per step, 200 ms: (10 - 0.5) / (0.2 + 0.2) s.
        assert!(close(at(&settings(), 200).max_continuous_hz, 9.5 / 0.4));
        // Four ticks per step quadruple it (less the half tick).
        let slow = Limits {
            chunk_period_ns: 200 * MS,
            ..settings()
        };
        assert!(close(at(&slow, 200).max_continuous_hz, 39.5 / 0.4));
    }
}

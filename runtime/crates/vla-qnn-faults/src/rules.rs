//! The fault plan: the rules file a test writes, parsed, and the per-function call
//! counters and subsystem-restart state that decide what each intercepted call does.
//! No FFI here: `lib.rs` asks [`Plan::decide`] and does what it answers.
//!
//! Rules file (one rule a line, `#` starts a comment):
//!
//! ```text
//! real /abs/path/libQnnHtp.so            # the library to wrap (else $VLA_QNN_FAULTS_REAL)
//! graphExecute from=+1 times=1 code=1003 # the next call fails once with 1003
//! graphExecute from=5 times=forever block_ms=60000
//! ssr on=graphExecute from=+1            # a DSP restart, as QNN's object validity table says
//! ssr on=graphExecute from=+1 until=backend   # every call fails until backendFree + backendCreate
//! ```
//!
//! `from=K` is the K-th call of that function since the library was loaded (1-based);
//! `from=+K` the K-th call after the file was (re)read. `times` defaults to 1. A rule
//! with `block_ms` sleeps that long, then returns `code` if it has one, else forwards.
//! The file is re-read whenever its modification time changes, so a test arms a fault
//! while the daemon runs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// `QNN_COMMON_ERROR_SYSTEM_COMMUNICATION` (QnnCommon.h: 1000 + 7): the DSP restarted and
/// QNN recovered the connection; every stale object answers it.
pub const SYSTEM_COMMUNICATION: u64 = 1007;

/// The QNN functions the wrapper intercepts (every other slot is the real function).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    /// `backendCreate` (slot 1).
    BackendCreate,
    /// `backendFree` (slot 8).
    BackendFree,
    /// `contextCreateFromBinary` (slot 13).
    ContextCreateFromBinary,
    /// `contextFree` (slot 14).
    ContextFree,
    /// `graphRetrieve` (slot 20).
    GraphRetrieve,
    /// `graphExecute` (slot 21).
    GraphExecute,
    /// `deviceGetInfrastructure` (slot 39).
    DeviceGetInfrastructure,
    /// `deviceCreate` (slot 40).
    DeviceCreate,
    /// `deviceFree` (slot 43).
    DeviceFree,
    /// The HTP performance infrastructure's `createPowerConfigId`.
    CreatePowerConfigId,
    /// The HTP performance infrastructure's `setPowerConfig` (the vote itself).
    SetPowerConfig,
}

impl Func {
    const ALL: [Func; 11] = [
        Func::BackendCreate,
        Func::BackendFree,
        Func::ContextCreateFromBinary,
        Func::ContextFree,
        Func::GraphRetrieve,
        Func::GraphExecute,
        Func::DeviceGetInfrastructure,
        Func::DeviceCreate,
        Func::DeviceFree,
        Func::CreatePowerConfigId,
        Func::SetPowerConfig,
    ];

    /// The QNN name, as in the rules file and the wrapper's log lines.
    pub fn name(self) -> &'static str {
        match self {
            Func::BackendCreate => "backendCreate",
            Func::BackendFree => "backendFree",
            Func::ContextCreateFromBinary => "contextCreateFromBinary",
            Func::ContextFree => "contextFree",
            Func::GraphRetrieve => "graphRetrieve",
            Func::GraphExecute => "graphExecute",
            Func::DeviceGetInfrastructure => "deviceGetInfrastructure",
            Func::DeviceCreate => "deviceCreate",
            Func::DeviceFree => "deviceFree",
            Func::CreatePowerConfigId => "createPowerConfigId",
            Func::SetPowerConfig => "setPowerConfig",
        }
    }

    fn parse(s: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == s)
    }

    fn index(self) -> usize {
        Func::ALL.iter().position(|&f| f == self).unwrap_or(0)
    }

    /// The calls that release an object: always allowed after a restart, so a client
    /// can clean up.
    fn frees(self) -> bool {
        matches!(
            self,
            Func::BackendFree | Func::ContextFree | Func::DeviceFree
        )
    }
}

/// A rule's start: an absolute call number or one relative to the file's (re)reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum From {
    Absolute(u64),
    Relative(u64),
}

/// One error or block rule.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    func: Func,
    from: u64,
    /// `None`: forever.
    times: Option<u64>,
    code: Option<u64>,
    block: Option<Duration>,
    fired: u64,
}

/// A subsystem restart to play.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SsrRule {
    on: Func,
    from: u64,
    /// The stricter model: every call but the frees fails until the backend is re-created.
    until_backend: bool,
    fired: bool,
}

/// What an intercepted call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Call the real function.
    Forward,
    /// Return this code without calling it.
    Fail(u64),
    /// Sleep, then fail with the code or (None) forward.
    Block(Duration, Option<u64>),
}

/// The restart in effect.
#[derive(Debug, Default)]
struct Restart {
    until_backend: bool,
    backend_freed: bool,
    /// Contexts (and graphs) created before the restart: they answer 1007 (the table:
    /// `Qnn_ContextHandle_t` and `Qnn_GraphHandle_t` invalid until freed and re-created).
    stale_contexts: HashSet<usize>,
    stale_graphs: HashSet<usize>,
}

/// The parsed rules file with the counters and the objects the wrapper has seen.
#[derive(Debug, Default)]
pub struct Plan {
    /// `real` from the file.
    pub real: Option<String>,
    rules: Vec<Rule>,
    ssr: Vec<SsrRule>,
    counts: [u64; Func::ALL.len()],
    contexts: HashSet<usize>,
    graphs: HashMap<usize, usize>,
    restart: Option<Restart>,
}

/// A rules file that could not be read, in one line.
#[derive(Debug, PartialEq, Eq)]
pub struct RuleError(pub String);

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RuleError {}

fn number(line: usize, key: &str, v: &str) -> Result<u64, RuleError> {
    v.parse()
        .map_err(|_| RuleError(format!("line {line}: {key}={v} is not a number")))
}

impl Plan {
    /// Replaces the rules with `text`'s; counters and tracked objects stay.
    pub fn load(&mut self, text: &str) -> Result<(), RuleError> {
        let mut rules = Vec::new();
        let mut ssr = Vec::new();
        let mut real = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let body = raw.split('#').next().unwrap_or("").trim();
            let mut words = body.split_whitespace();
            let Some(head) = words.next() else { continue };
            if head == "real" {
                real = words.next().map(str::to_owned);
                continue;
            }
            let (mut from, mut times, mut code, mut block) = (None, Some(1), None, None);
            let (mut on, mut until_backend) = (None, false);
            for w in words {
                let (k, v) = w
                    .split_once('=')
                    .ok_or_else(|| RuleError(format!("line {line}: `{w}` is not key=value")))?;
                match k {
                    "from" => {
                        from = Some(match v.strip_prefix('+') {
                            Some(n) => From::Relative(number(line, k, n)?),
                            None => From::Absolute(number(line, k, v)?),
                        })
                    }
                    "times" if v == "forever" => times = None,
                    "times" => times = Some(number(line, k, v)?),
                    "code" => code = Some(number(line, k, v)?),
                    "block_ms" => block = Some(Duration::from_millis(number(line, k, v)?)),
                    "on" => {
                        on = Some(Func::parse(v).ok_or_else(|| {
                            RuleError(format!("line {line}: no intercepted function `{v}`"))
                        })?)
                    }
                    "until" if v == "backend" => until_backend = true,
                    "until" if v == "contexts" => until_backend = false,
                    _ => return Err(RuleError(format!("line {line}: unknown `{w}`"))),
                }
            }
            let from = from.ok_or_else(|| RuleError(format!("line {line}: no from=")))?;
            if head == "ssr" {
                let on = on.unwrap_or(Func::GraphExecute);
                ssr.push(SsrRule {
                    on,
                    from: self.resolve(on, from),
                    until_backend,
                    fired: false,
                });
                continue;
            }
            let func = Func::parse(head).ok_or_else(|| {
                RuleError(format!("line {line}: no intercepted function `{head}`"))
            })?;
            if code.is_none() && block.is_none() {
                return Err(RuleError(format!("line {line}: needs code= or block_ms=")));
            }
            rules.push(Rule {
                func,
                from: self.resolve(func, from),
                times,
                code,
                block,
                fired: 0,
            });
        }
        self.rules = rules;
        self.ssr = ssr;
        self.real = real;
        Ok(())
    }

    fn resolve(&self, f: Func, from: From) -> u64 {
        match from {
            From::Absolute(n) => n,
            From::Relative(n) => self.counts[f.index()] + n,
        }
    }

    /// Counts a call of `f` (on object `handle`: the context or graph it names, else 0)
    /// and says what it does, with the call's number.
    pub fn decide(&mut self, f: Func, handle: usize) -> (u64, Outcome) {
        let n = {
            let c = &mut self.counts[f.index()];
            *c += 1;
            *c
        };
        if let Some(s) = self
            .ssr
            .iter_mut()
            .find(|s| !s.fired && s.on == f && n >= s.from)
        {
            s.fired = true;
            self.restart = Some(Restart {
                until_backend: s.until_backend,
                backend_freed: false,
                stale_contexts: self.contexts.clone(),
                stale_graphs: self.graphs.keys().copied().collect(),
            });
            return (n, Outcome::Fail(SYSTEM_COMMUNICATION));
        }
        if let Some(r) = &mut self.restart {
            if let Some(outcome) = r.during(f, handle) {
                return (n, outcome);
            }
        }
        for r in &mut self.rules {
            if r.func == f && n >= r.from && r.times.is_none_or(|t| r.fired < t) {
                r.fired += 1;
                let outcome = match (r.block, r.code) {
                    (Some(b), c) => Outcome::Block(b, c),
                    (None, Some(c)) => Outcome::Fail(c),
                    (None, None) => Outcome::Forward,
                };
                return (n, outcome);
            }
        }
        (n, Outcome::Forward)
    }

    /// Records a context the real library created.
    pub fn context_created(&mut self, ctx: usize) {
        self.contexts.insert(ctx);
    }

    /// Records a context freed (and forgets its graphs).
    pub fn context_freed(&mut self, ctx: usize) {
        self.contexts.remove(&ctx);
        self.graphs.retain(|_, c| *c != ctx);
        if let Some(r) = &mut self.restart {
            r.stale_contexts.remove(&ctx);
        }
    }

    /// Records a graph retrieved from `ctx`.
    pub fn graph_retrieved(&mut self, graph: usize, ctx: usize) {
        self.graphs.insert(graph, ctx);
        if let Some(r) = &mut self.restart {
            r.stale_graphs.remove(&graph);
        }
    }

    /// Records a backend freed or created (ends the stricter restart).
    pub fn backend_event(&mut self, created: bool) {
        let ends = match &mut self.restart {
            Some(r) if r.until_backend && !created => {
                r.backend_freed = true;
                false
            }
            Some(r) if r.until_backend => r.backend_freed,
            _ => false,
        };
        if ends {
            self.restart = None;
        }
    }

    /// Whether a restart is still in effect (tests of this module).
    pub fn restarting(&self) -> bool {
        self.restart.is_some()
    }
}

impl Restart {
    /// What `f` on `handle` does while the restart is in effect; `None`: the usual rules.
    fn during(&self, f: Func, handle: usize) -> Option<Outcome> {
        if f.frees() {
            return Some(Outcome::Forward);
        }
        if self.until_backend {
            return Some(if f == Func::BackendCreate && self.backend_freed {
                Outcome::Forward
            } else {
                Outcome::Fail(SYSTEM_COMMUNICATION)
            });
        }
        // QNN's table: backend, device and log stay valid; contexts, graphs (and memory
        // handles, not intercepted here) made before the restart are invalid.
        let stale = match f {
            Func::GraphRetrieve => self.stale_contexts.contains(&handle),
            Func::GraphExecute => self.stale_graphs.contains(&handle),
            _ => false,
        };
        stale.then_some(Outcome::Fail(SYSTEM_COMMUNICATION))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_fires_from_its_call_for_its_count() {
        let mut p = Plan::default();
        p.load("graphExecute from=2 times=2 code=1003 # two failures")
            .unwrap();
        let got: Vec<_> = (0..4).map(|_| p.decide(Func::GraphExecute, 1).1).collect();
        assert_eq!(
            got,
            [
                Outcome::Forward,
                Outcome::Fail(1003),
                Outcome::Fail(1003),
                Outcome::Forward
            ]
        );
        // Relative to the reading: the next call.
        p.load("graphExecute from=+1 times=forever block_ms=5")
            .unwrap();
        assert_eq!(
            p.decide(Func::GraphExecute, 1).1,
            Outcome::Block(Duration::from_millis(5), None)
        );
        assert_eq!(
            p.decide(Func::GraphExecute, 1).1,
            Outcome::Block(Duration::from_millis(5), None)
        );
    }

    #[test]
    fn a_restart_invalidates_what_qnn_s_table_says_until_it_is_re_created() {
        let mut p = Plan::default();
        p.context_created(10);
        p.graph_retrieved(11, 10);
        p.load("ssr from=+1").unwrap();
        assert_eq!(p.decide(Func::GraphExecute, 11).1, Outcome::Fail(1007));
        assert_eq!(p.decide(Func::GraphExecute, 11).1, Outcome::Fail(1007));
        assert_eq!(p.decide(Func::GraphRetrieve, 10).1, Outcome::Fail(1007));
        // Backend and device stay valid; the stale context is freed and re-created.
        assert_eq!(p.decide(Func::DeviceCreate, 0).1, Outcome::Forward);
        assert_eq!(p.decide(Func::ContextFree, 10).1, Outcome::Forward);
        p.context_freed(10);
        assert_eq!(
            p.decide(Func::ContextCreateFromBinary, 0).1,
            Outcome::Forward
        );
        p.context_created(20);
        assert_eq!(p.decide(Func::GraphRetrieve, 20).1, Outcome::Forward);
        p.graph_retrieved(21, 20);
        assert_eq!(p.decide(Func::GraphExecute, 21).1, Outcome::Forward);
    }

    #[test]
    fn the_stricter_restart_lasts_until_the_backend_is_freed_and_created() {
        let mut p = Plan::default();
        p.load("ssr on=graphExecute from=+1 until=backend").unwrap();
        assert_eq!(p.decide(Func::GraphExecute, 1).1, Outcome::Fail(1007));
        assert_eq!(
            p.decide(Func::ContextCreateFromBinary, 0).1,
            Outcome::Fail(1007)
        );
        assert_eq!(p.decide(Func::BackendCreate, 0).1, Outcome::Fail(1007));
        assert_eq!(p.decide(Func::ContextFree, 1).1, Outcome::Forward);
        assert_eq!(p.decide(Func::BackendFree, 1).1, Outcome::Forward);
        p.backend_event(false);
        assert!(p.restarting());
        assert_eq!(p.decide(Func::BackendCreate, 0).1, Outcome::Forward);
        p.backend_event(true);
        assert!(!p.restarting());
        assert_eq!(p.decide(Func::GraphExecute, 1).1, Outcome::Forward);
    }

    #[test]
    fn a_bad_rule_is_one_line_naming_it() {
        let mut p = Plan::default();
        let e = p.load("\ngraphExecut from=1 code=1").unwrap_err();
        assert_eq!(e.0, "line 2: no intercepted function `graphExecut`");
        assert!(p.load("graphExecute from=1").is_err());
        assert!(p.load("graphExecute code=3").is_err());
    }
}

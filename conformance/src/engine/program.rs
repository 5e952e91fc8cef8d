//! Workflow programs as data: a serde-able tree of durable operations that one generic body
//! ([`super::interp`]) runs on the real engine and the reference interpreter
//! ([`super::reference`]) runs without any store, and the proptest strategies that generate
//! them.

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A workflow program: an input (random JSON, echoed as a digest in the output) and a body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The tool input's payload (random JSON, possibly large).
    pub input: Value,
    /// The operations, run in order.
    pub body: Vec<Node>,
    /// With a cleanup step, the body races every wait against its abort signal; once a cancel
    /// request is delivered it stops waiting, runs this step (named `cleanup`) in the grace
    /// period and returns. Without one, a cancelled body is abandoned where it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<StepSpec>,
    /// Run as a background tool (its body gets a `TaskHandle`: [`Node::Message`] posts).
    #[serde(default)]
    pub background: bool,
}

/// One operation of a program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Node {
    /// `ctx.step(name, ..)`, awaited.
    Step(StepSpec),
    /// Several steps issued together, awaited with `ctx.join_all` (they run concurrently).
    Join(Vec<StepSpec>),
    /// `ctx.sleep(ms)`, awaited.
    Sleep {
        /// The duration in milliseconds.
        ms: u64,
    },
    /// `ctx.create_hook(token)`, then `hook.next()` once per scripted payload; the driver
    /// delivers each payload when the run parks on it.
    Hook {
        /// The token's suffix (the driver prefixes it with the case's instance id).
        token: String,
        /// The payloads delivered, in order.
        payloads: Vec<Value>,
    },
    /// `ctx.race(hook.next(), ctx.sleep(ms))`: with a payload the driver delivers it when the
    /// run parks (the hook wins); without one it lets the clock run (the sleep wins).
    Race {
        /// The token's suffix.
        token: String,
        /// The sleep's duration in milliseconds (hours: lease expiries never fire it early).
        sleep_ms: u64,
        /// What the hook receives, if anything.
        payload: Option<Value>,
    },
    /// A nested block: a step failure inside ends the block and is recorded in the output;
    /// the program goes on after the block.
    Catch(Vec<Node>),
    /// `ctx.ask(..)` (a free-text request), awaited; the driver answers `text` when the run
    /// parks on it.
    Ask {
        /// The answer's text.
        text: String,
    },
    /// `ctx.race(ask, ctx.sleep(ms))`: with an answer the driver answers when the run parks
    /// (the ask wins); without one the sleep wins and the request stays pending until the run
    /// ends, which withdraws it.
    RaceAsk {
        /// The sleep's duration in milliseconds (hours).
        sleep_ms: u64,
        /// The answer's text, if the request is answered.
        answer: Option<String>,
    },
    /// `ctx.progress(value)`.
    Progress {
        /// The progress value.
        value: Value,
    },
    /// `task.post_message(value)` (background programs only; elsewhere generated as
    /// [`Node::Progress`]).
    Message {
        /// The message.
        value: Value,
    },
    /// `ctx.agent(..)` of the target `conformance`, awaited: the scripted agent host replies at
    /// once with `Ok(output)` or `Err(message)`.
    Agent {
        /// The call's key (unique in the program, see [`Program::numbered`]).
        key: String,
        /// What the child returns.
        reply: Result<Value, String>,
    },
}

/// A step's scripted behaviour, by attempt: attempts `1..=failures` fail with a retryable
/// error; the next attempt fails fatally if `fatal`, else returns `output`. The step's retry
/// policy allows `retries` retries (so `failures > retries` exhausts them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    /// The step's name, unique in the program (see [`Program::numbered`]).
    pub name: String,
    /// Retryable failures before the attempt that decides.
    pub failures: u8,
    /// `RetryPolicy::retries(retries)`.
    pub retries: u8,
    /// The deciding attempt fails fatally.
    pub fatal: bool,
    /// What a successful attempt returns.
    pub output: Output,
    /// A local step (`StepFuture::local`): its outcome commits with the next ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local: bool,
}

/// A step's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// This JSON value.
    Json(Value),
    /// A string of `len` characters drawn from `seed` (large outputs without large programs).
    Blob {
        /// Seeds the characters.
        seed: u64,
        /// Length in bytes.
        len: u32,
    },
}

impl Output {
    /// The JSON value a successful attempt returns.
    pub fn value(&self) -> Value {
        match self {
            Output::Json(v) => v.clone(),
            Output::Blob { seed, len } => {
                const ALPHABET: &[u8] =
                    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_";
                let mut state = *seed;
                let mut s = String::with_capacity(*len as usize);
                for _ in 0..*len {
                    state = splitmix(state);
                    s.push(ALPHABET[(state % ALPHABET.len() as u64) as usize] as char);
                }
                Value::String(s)
            }
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A short, stable digest of a JSON value (its length and FNV-1a hash of its text), what the
/// program's output records instead of whole (possibly large) values.
pub fn digest(v: &Value) -> String {
    let text = v.to_string();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}:{h:016x}", text.len())
}

impl Program {
    /// Gives every step a unique name (`s0`, `s1`, … in program order) and every hook a unique
    /// token suffix (`h0`, …), so that journals and outputs name them unambiguously.
    pub fn numbered(mut self) -> Self {
        let (mut steps, mut hooks) = (0, 0);
        number(&mut self.body, &mut steps, &mut hooks);
        if let Some(c) = &mut self.cleanup {
            c.name = "cleanup".into();
        }
        self
    }

    /// Steps in the program (executed or not).
    pub fn step_count(&self) -> usize {
        fn count(nodes: &[Node]) -> usize {
            nodes
                .iter()
                .map(|n| match n {
                    Node::Step(_) => 1,
                    Node::Join(s) => s.len(),
                    Node::Catch(b) => count(b),
                    _ => 0,
                })
                .sum()
        }
        count(&self.body)
    }
}

fn number(nodes: &mut [Node], steps: &mut u32, hooks: &mut u32) {
    fn name(s: &mut StepSpec, steps: &mut u32) {
        s.name = format!("s{steps}");
        *steps += 1;
    }
    for n in nodes {
        match n {
            Node::Step(s) => name(s, steps),
            Node::Join(ss) => ss.iter_mut().for_each(|s| name(s, steps)),
            Node::Hook { token, .. } | Node::Race { token, .. } => {
                *token = format!("h{hooks}");
                *hooks += 1;
            }
            Node::Catch(b) => number(b, steps, hooks),
            Node::Agent { key, .. } => {
                *key = format!("a{hooks}");
                *hooks += 1;
            }
            Node::Sleep { .. }
            | Node::Ask { .. }
            | Node::RaceAsk { .. }
            | Node::Progress { .. }
            | Node::Message { .. } => {}
        }
    }
}

/// How large and varied generated programs are.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Top-level nodes at most.
    pub max_nodes: usize,
    /// Generate hooks and races (they need deliveries).
    pub waits: bool,
    /// Largest step output in bytes (a few outputs are this large; most are small JSON).
    pub max_blob: u32,
    /// At least one park point (a sleep or a hook) is guaranteed.
    pub must_park: bool,
    /// That park point is a hook (so the program takes deliveries).
    pub park_on_hook: bool,
    /// Percent of steps that are local (they commit in batches).
    pub local_percent: u8,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            max_nodes: 7,
            waits: true,
            max_blob: 1 << 20,
            must_park: false,
            park_on_hook: false,
            local_percent: 25,
        }
    }
}

/// Random JSON: nulls, booleans, integers, floats, unicode strings, nested arrays and objects.
pub fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "\\PC{0,16}".prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\/]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("\\PC{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn output(max_blob: u32) -> impl Strategy<Value = Output> {
    prop_oneof![
        20 => json().prop_map(Output::Json),
        1 => (any::<u64>(), 1_000u32..=max_blob.max(1_001)).prop_map(|(seed, len)| Output::Blob { seed, len }),
    ]
}

/// A step: usually succeeds at once; sometimes fails a few times (retryable), sometimes fatally,
/// sometimes exhausts its retries; `local_percent` of them are local.
pub fn step_spec(max_blob: u32, local_percent: u8) -> BoxedStrategy<StepSpec> {
    let failures = prop_oneof![6 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)];
    (
        failures,
        0u8..=3,
        prop::bool::weighted(0.08),
        output(max_blob),
        prop::bool::weighted(f64::from(local_percent.min(100)) / 100.0),
    )
        .prop_map(|(failures, retries, fatal, output, local)| StepSpec {
            name: String::new(),
            failures,
            retries,
            fatal,
            output,
            local,
        })
        .boxed()
}

fn node(shape: Shape) -> BoxedStrategy<Node> {
    let step = step_spec(shape.max_blob, shape.local_percent);
    let leaf = if shape.waits {
        prop_oneof![
            8 => step.clone().prop_map(Node::Step),
            2 => vec(step, 2..=3).prop_map(Node::Join),
            2 => (1u64..=120_000).prop_map(|ms| Node::Sleep { ms }),
            2 => vec(json(), 1..=3).prop_map(|payloads| Node::Hook { token: String::new(), payloads }),
            2 => (3_600_000u64..=86_400_000, option::of(json()))
                .prop_map(|(sleep_ms, payload)| Node::Race { token: String::new(), sleep_ms, payload }),
            2 => "\\PC{0,24}".prop_map(|text| Node::Ask { text }),
            2 => (3_600_000u64..=86_400_000, option::of("\\PC{0,24}"))
                .prop_map(|(sleep_ms, answer)| Node::RaceAsk { sleep_ms, answer }),
            1 => json().prop_map(|value| Node::Progress { value }),
            1 => json().prop_map(|value| Node::Message { value }),
            2 => prop_oneof![
                3 => json().prop_map(Ok),
                1 => "\\PC{1,16}".prop_map(Err),
            ]
            .prop_map(|reply| Node::Agent { key: String::new(), reply }),
        ]
        .boxed()
    } else {
        prop_oneof![
            8 => step.clone().prop_map(Node::Step),
            2 => vec(step, 2..=3).prop_map(Node::Join),
            2 => (1u64..=120_000).prop_map(|ms| Node::Sleep { ms }),
        ]
        .boxed()
    };
    leaf.prop_recursive(2, 12, 4, |inner| vec(inner, 1..4).prop_map(Node::Catch))
        .boxed()
}

/// Programs of `shape`, numbered (unique step names and hook tokens).
pub fn program(shape: Shape) -> BoxedStrategy<Program> {
    let hook = vec(json(), 1..=2).prop_map(|payloads| {
        Some(Node::Hook {
            token: String::new(),
            payloads,
        })
    });
    let park = if shape.must_park && shape.park_on_hook {
        hook.boxed()
    } else if shape.must_park {
        prop_oneof![
            (1u64..=120_000).prop_map(|ms| Some(Node::Sleep { ms })),
            hook,
        ]
        .boxed()
    } else {
        Just(None).boxed()
    };
    (
        json(),
        vec(node(shape), 0..=shape.max_nodes),
        park,
        any::<prop::sample::Index>(),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(input, mut body, park, at, background)| {
            if !background {
                no_messages(&mut body);
            }
            if let Some(p) = park {
                // Not after a top-level step that fails the run, which would skip it.
                let failing = body.iter().position(fails_run).unwrap_or(body.len());
                body.insert(at.index(failing + 1), p);
            }
            Program {
                input,
                body,
                cleanup: None,
                background,
            }
            .numbered()
        })
        .boxed()
}

impl StepSpec {
    /// Whether the step ends failed (fatally, or with its retries exhausted).
    pub fn fails(&self) -> bool {
        self.failures > self.retries || self.fatal
    }
}

impl Program {
    /// Names of the local steps that run in a batch of local steps when they run: local steps
    /// on their own or in a join of local steps only (a local step joined with a normal one
    /// runs as a normal step).
    pub fn batched_local_steps(&self) -> Vec<String> {
        fn walk(nodes: &[Node], out: &mut Vec<String>) {
            for n in nodes {
                match n {
                    Node::Step(s) if s.local => out.push(s.name.clone()),
                    Node::Join(ss) if ss.iter().all(|s| s.local) => {
                        out.extend(ss.iter().map(|s| s.name.clone()))
                    }
                    Node::Catch(b) => walk(b, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.body, &mut out);
        out
    }
}

/// Whether a top-level node fails the run (a failing step outside any [`Node::Catch`]).
fn fails_run(n: &Node) -> bool {
    match n {
        Node::Step(s) => s.fails(),
        Node::Join(ss) => ss.iter().any(StepSpec::fails),
        _ => false,
    }
}

/// Turns messages into progress values (only background bodies can post messages).
fn no_messages(nodes: &mut [Node]) {
    for n in nodes {
        match n {
            Node::Message { value } => {
                *n = Node::Progress {
                    value: std::mem::take(value),
                }
            }
            Node::Catch(b) => no_messages(b),
            _ => {}
        }
    }
}

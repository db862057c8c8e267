//! Per-rank timelines in Chrome's trace-event format (`{"traceEvents": [...]}`, complete events
//! `"ph": "X"` with `ts` and `dur` in µs), which Perfetto (ui.perfetto.dev) and chrome://tracing
//! open as they are. Each rank is a process (`pid`) with three tracks (`tid`): the tiles it
//! computes, its ring traffic (sends, receives, waits, collectives) and the model's parts around
//! them (layers, feed-forward, optimizer, decode steps).
//!
//! An event is recorded where the rank's own counter is taken, from the same clock readings: a
//! tile's event spans exactly the seconds its `StepEvent` says, a wait's the seconds added to
//! `wait_seconds`, a send's `args.bytes` the bytes its `SendRecord` holds. The trace and the tables
//! are one measurement.
//!
//! Off unless a [`Recorder`] is installed ([`install`]): the communicator and the ring's context
//! then hold `None` and the tile loop pays one branch, the model's spans one atomic load; nothing
//! is allocated and no lock is taken.

use serde_json::{Value, json};
use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// A rank's tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    /// The tiles the rank computes.
    Compute = 0,
    /// Its sends, receives, waits and collectives.
    Ring = 1,
    /// The model's parts around them: layers, feed-forward, optimizer, decode steps.
    Model = 2,
}

impl Track {
    /// Every track, in `tid` order.
    pub const ALL: [Track; 3] = [Track::Compute, Track::Ring, Track::Model];

    /// Its name in the viewer.
    pub fn name(self) -> &'static str {
        match self {
            Track::Compute => "compute",
            Track::Ring => "ring",
            Track::Model => "model",
        }
    }
}

/// One complete event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened: `tile fwd`, `send`, `wait`, `layer 0 ffn`...
    pub name: String,
    /// Its category: `compute`, `comm`, `model`.
    pub cat: &'static str,
    /// The rank.
    pub pid: usize,
    /// The track.
    pub track: Track,
    /// Its start, µs since the recorder's origin.
    pub ts: f64,
    /// Its length, µs.
    pub dur: f64,
    /// The numbers it carries (bytes, FLOPs, peer, step...).
    pub args: Value,
}

/// Where a process's events are kept while it runs.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    /// µs after `origin` at which every process of a job passed the same barrier: written events
    /// are shifted by it, so that processes share one time axis.
    aligned_at: Mutex<f64>,
    events: Mutex<Vec<Event>>,
}

/// Whether a recorder is installed (read by the model's spans before anything else).
static ON: AtomicBool = AtomicBool::new(false);
/// The installed recorder.
static CURRENT: Mutex<Option<Arc<Recorder>>> = Mutex::new(None);

thread_local! {
    /// The rank this thread runs, once a ring context was made on it (the model's spans' `pid`).
    static RANK: Cell<Option<usize>> = const { Cell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs `recorder`: the communicators and contexts made from now on record into it.
pub fn install(recorder: Arc<Recorder>) {
    *lock(&CURRENT) = Some(recorder);
    ON.store(true, Ordering::SeqCst);
}

/// Takes the installed recorder out (nothing records after this).
pub fn uninstall() -> Option<Arc<Recorder>> {
    ON.store(false, Ordering::SeqCst);
    lock(&CURRENT).take()
}

/// The installed recorder, if any.
pub fn current() -> Option<Arc<Recorder>> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    lock(&CURRENT).clone()
}

/// Says that this thread runs rank `rank` (a ring context made on it), for the model's spans.
pub(crate) fn set_thread_rank(rank: usize) {
    RANK.with(|r| r.set(Some(rank)));
}

/// A span of the model's track, recorded when dropped; inert (and free) when nothing records or
/// the thread runs no rank.
#[must_use = "a span records when dropped"]
pub struct Span {
    open: Option<(Arc<Recorder>, usize, String, Instant)>,
}

/// Opens a span named `name` on this thread's rank's model track.
pub fn span(name: impl FnOnce() -> String) -> Span {
    if !ON.load(Ordering::Relaxed) {
        return Span { open: None };
    }
    let Some(rank) = RANK.with(Cell::get) else {
        return Span { open: None };
    };
    Span {
        open: current().map(|r| (r, rank, name(), Instant::now())),
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((recorder, rank, name, start)) = self.open.take() {
            recorder.complete(
                (rank, Track::Model),
                (name, "model"),
                start,
                start.elapsed().as_secs_f64(),
                json!({}),
            );
        }
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            origin: Instant::now(),
            aligned_at: Mutex::new(0.0),
            events: Mutex::new(Vec::new()),
        })
    }

    /// Records a complete event of `(pid, track)` that began at `start` and lasted `seconds` (the
    /// seconds the caller's counter adds, so that the two agree).
    pub fn complete(
        &self,
        (pid, track): (usize, Track),
        (name, cat): (String, &'static str),
        start: Instant,
        seconds: f64,
        args: Value,
    ) {
        let ts = start.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        lock(&self.events).push(Event {
            name,
            cat,
            pid,
            track,
            ts,
            dur: seconds * 1e6,
            args,
        });
    }

    /// Marks now as this process's zero: called by every process of a job right after the same
    /// barrier, so that their events share one time axis.
    pub fn align_here(&self) {
        *lock(&self.aligned_at) = self.origin.elapsed().as_secs_f64() * 1e6;
    }

    /// The events so far, on the aligned axis (µs after the barrier; earlier events negative).
    pub fn events(&self) -> Vec<Event> {
        let shift = *lock(&self.aligned_at);
        lock(&self.events)
            .iter()
            .map(|e| Event {
                ts: e.ts - shift,
                ..e.clone()
            })
            .collect()
    }

    /// Adds events another process recorded (already on the shared axis, as [`Recorder::events`]
    /// gives them): what rank 0 of an MPI job gathers.
    pub fn absorb(&self, events: Vec<Event>) {
        let shift = *lock(&self.aligned_at);
        lock(&self.events).extend(events.into_iter().map(|e| Event {
            ts: e.ts + shift,
            ..e
        }));
    }

    /// The trace as Chrome's JSON object: the events, earliest first, then each rank's and
    /// track's name (metadata events), so a viewer shows `rank N` and `compute`, `ring`, `model`.
    pub fn to_json(&self) -> Value {
        let mut events = self.events();
        events.sort_by(|a, b| {
            (a.pid, a.track, a.ts)
                .partial_cmp(&(b.pid, b.track, b.ts))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let mut ranks: Vec<usize> = events.iter().map(|e| e.pid).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let mut out: Vec<Value> = events.iter().map(event_json).collect();
        for &pid in &ranks {
            out.push(
                json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "ts": 0, "args": {"name": format!("rank {pid}")}}),
            );
            out.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "ts": 0, "args": {"sort_index": pid}}),
            );
            for track in Track::ALL {
                out.push(json!({"ph": "M", "name": "thread_name", "pid": pid,
                    "tid": track as usize, "ts": 0, "args": {"name": track.name()}}));
            }
        }
        json!({"traceEvents": out, "displayTimeUnit": "ms"})
    }

    /// Writes [`Recorder::to_json`] to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string(&self.to_json()).expect("JSON of a trace");
        std::fs::write(path, text)
    }
}

fn event_json(e: &Event) -> Value {
    json!({
        "name": e.name,
        "cat": e.cat,
        "ph": "X",
        "ts": e.ts,
        "dur": e.dur,
        "pid": e.pid,
        "tid": e.track as usize,
        "args": e.args,
    })
}

/// Events as words for a gather over ranks (their JSON's bytes, 8 a word, the length first).
pub fn to_words(events: &[Event]) -> Vec<u64> {
    let json = Value::Array(events.iter().map(event_json).collect()).to_string();
    let bytes = json.as_bytes();
    let mut words = vec![bytes.len() as u64];
    words.extend(bytes.chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    }));
    words
}

/// [`to_words`] read back; `None` for words that are not such events.
pub fn from_words(words: &[u64]) -> Option<Vec<Event>> {
    let (&len, rest) = words.split_first()?;
    let mut bytes: Vec<u8> = rest.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(usize::try_from(len).ok()?);
    let Value::Array(items) = serde_json::from_slice(&bytes).ok()? else {
        return None;
    };
    items
        .into_iter()
        .map(|item| {
            let track = match item.get("tid")?.as_u64()? {
                0 => Track::Compute,
                1 => Track::Ring,
                _ => Track::Model,
            };
            let cat = match item.get("cat")?.as_str()? {
                "compute" => "compute",
                "comm" => "comm",
                _ => "model",
            };
            Some(Event {
                name: item.get("name")?.as_str()?.to_owned(),
                cat,
                pid: item.get("pid")?.as_u64()? as usize,
                track,
                ts: item.get("ts")?.as_f64()?,
                dur: item.get("dur")?.as_f64()?,
                args: item.get("args")?.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_travel_as_words_and_come_back() {
        let recorder = Recorder::new();
        let start = Instant::now();
        recorder.complete(
            (3, Track::Ring),
            ("send".into(), "comm"),
            start,
            0.25,
            json!({"bytes": 4096, "to": 0}),
        );
        let events = recorder.events();
        let back = from_words(&to_words(&events)).unwrap();
        assert_eq!(back, events);
        assert_eq!(back[0].dur, 0.25e6);
        assert_eq!(from_words(&[9, 1]), None);
    }
}

//! Looking children up by id, across restarts.
//!
//! A restarted child is a new actor with a new `ActorRef`, so holding on to a child's ref is
//! wrong after a crash. Every supervisor keeps a [`Children`] table that it updates whenever a
//! child starts, stops or is restarted; the table is shared (an `Arc`), so lookups are cheap,
//! synchronous, and never wait on the supervisor (they work even while it is busy restarting,
//! and from a child's `init` while the supervisor itself is still starting).
//!
//! * [`Children::get`] returns the current typed `ActorRef` of a child, or `None` while it is
//!   down (between crash and restart) or if the id is unknown or of another message type.
//! * [`ChildHandle`] is a cloneable `(table, id)` pair that resolves the child at every use:
//!   hand it to another actor instead of an `ActorRef`.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use ractor::{ActorCell, ActorRef, ActorStatus, Message};

use crate::error::SupervisorError;

#[derive(Debug)]
struct Entry {
    /// Position in start order (smaller started first).
    seq: u64,
    cell: Option<ActorCell>,
}

/// The table: entries by id, plus the start order. Maps, so that a dynamic supervisor with
/// thousands of children still looks up, adds and removes in O(log n).
#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<String, Entry>,
    order: BTreeMap<u64, String>,
    next: u64,
}

impl Table {
    fn live(cell: &Option<ActorCell>) -> Option<&ActorCell> {
        cell.as_ref()
            .filter(|c| c.get_status() <= ActorStatus::Upgrading)
    }
}

/// The live children of one supervisor, by id, in start order. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Children {
    inner: Arc<RwLock<Table>>,
}

impl Children {
    fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        // A panic while holding the lock cannot leave the table half-updated in a way readers
        // care about (each write keeps by_id and order in step before it can panic), so a
        // poisoned lock is still safe to use.
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    fn write<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// The current `ActorRef` of child `id`, if it is running and its message type is `M`.
    pub fn get<M: Message>(&self, id: &str) -> Option<ActorRef<M>> {
        let cell = self.cell(id)?;
        if cell.is_message_type_of::<M>() == Some(false) {
            return None;
        }
        Some(ActorRef::from(cell))
    }

    /// The current untyped `ActorCell` of child `id`, if it is running.
    pub fn cell(&self, id: &str) -> Option<ActorCell> {
        self.read(|t| t.by_id.get(id).and_then(|e| Table::live(&e.cell)).cloned())
    }

    /// Whether the supervisor knows child `id` (running or awaiting restart).
    pub fn contains(&self, id: &str) -> bool {
        self.read(|t| t.by_id.contains_key(id))
    }

    /// Ids of all children the supervisor knows (running or awaiting restart), in start order.
    pub fn ids(&self) -> Vec<String> {
        self.read(|t| t.order.values().cloned().collect())
    }

    /// Ids of the children that are running right now, in start order.
    pub fn running(&self) -> Vec<String> {
        self.read(|t| {
            t.order
                .values()
                .filter(|id| {
                    t.by_id
                        .get(id.as_str())
                        .is_some_and(|e| Table::live(&e.cell).is_some())
                })
                .cloned()
                .collect()
        })
    }

    /// Number of children the supervisor knows (running or awaiting restart).
    pub fn len(&self) -> usize {
        self.read(|t| t.by_id.len())
    }

    /// True when the supervisor has no children.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handle that resolves child `id` (of message type `M`) at every use.
    pub fn handle<M: Message>(&self, id: impl Into<String>) -> ChildHandle<M> {
        ChildHandle {
            children: self.clone(),
            id: id.into(),
            _msg: PhantomData,
        }
    }

    /// Set (or clear, with `None`) the actor of child `id`, appending the id if it is new.
    pub(crate) fn set(&self, id: &str, cell: Option<ActorCell>) {
        self.write(|t| match t.by_id.get_mut(id) {
            Some(e) => e.cell = cell,
            None => {
                let seq = t.next;
                t.next += 1;
                t.order.insert(seq, id.to_string());
                t.by_id.insert(id.to_string(), Entry { seq, cell });
            }
        })
    }

    /// Replace the whole table with `ids`, none of them running (a supervisor (re)starting).
    pub(crate) fn reset<'a>(&self, ids: impl Iterator<Item = &'a str>) {
        self.write(|t| {
            *t = Table::default();
        });
        for id in ids {
            self.set(id, None);
        }
    }

    /// Forget child `id`.
    pub(crate) fn remove(&self, id: &str) {
        self.write(|t| {
            if let Some(e) = t.by_id.remove(id) {
                t.order.remove(&e.seq);
            }
        })
    }
}

/// A cheap cloneable reference to "whatever actor is child `id` right now".
#[derive(Debug)]
pub struct ChildHandle<M> {
    children: Children,
    id: String,
    _msg: PhantomData<fn() -> M>,
}

impl<M> Clone for ChildHandle<M> {
    fn clone(&self) -> Self {
        Self {
            children: self.children.clone(),
            id: self.id.clone(),
            _msg: PhantomData,
        }
    }
}

impl<M> ChildHandle<M> {
    /// The child id this handle resolves.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<M: Message> ChildHandle<M> {
    /// The child's current `ActorRef`, or `None` while it is down.
    pub fn get(&self) -> Option<ActorRef<M>> {
        self.children.get::<M>(&self.id)
    }

    /// Send `msg` to the current child. Fails with [`SupervisorError::NotFound`] while the
    /// child is down (the message is dropped).
    pub fn cast(&self, msg: M) -> Result<(), SupervisorError> {
        let actor = self
            .get()
            .ok_or_else(|| SupervisorError::NotFound(self.id.clone()))?;
        actor
            .send_message(msg)
            .map_err(|_| SupervisorError::NotFound(self.id.clone()))
    }
}

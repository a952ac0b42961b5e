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

use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use ractor::{ActorCell, ActorRef, ActorStatus, Message};

use crate::error::SupervisorError;

#[derive(Debug)]
struct Entry {
    id: String,
    cell: Option<ActorCell>,
}

/// The live children of one supervisor, by id, in start order. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Children {
    inner: Arc<RwLock<Vec<Entry>>>,
}

impl Children {
    fn read<R>(&self, f: impl FnOnce(&Vec<Entry>) -> R) -> R {
        // A panic while holding the lock cannot leave the Vec half-updated (every write is a
        // single push/assign/remove), so a poisoned lock is still safe to read.
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    fn write<R>(&self, f: impl FnOnce(&mut Vec<Entry>) -> R) -> R {
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
        self.read(|v| {
            v.iter()
                .find(|e| e.id == id)
                .and_then(|e| e.cell.clone())
                .filter(|c| c.get_status() <= ActorStatus::Upgrading)
        })
    }

    /// Ids of all children the supervisor knows (running or awaiting restart), in start order.
    pub fn ids(&self) -> Vec<String> {
        self.read(|v| v.iter().map(|e| e.id.clone()).collect())
    }

    /// Ids of the children that are running right now, in start order.
    pub fn running(&self) -> Vec<String> {
        self.read(|v| {
            v.iter()
                .filter(|e| {
                    e.cell
                        .as_ref()
                        .is_some_and(|c| c.get_status() <= ActorStatus::Upgrading)
                })
                .map(|e| e.id.clone())
                .collect()
        })
    }

    /// Number of children the supervisor knows (running or awaiting restart).
    pub fn len(&self) -> usize {
        self.read(|v| v.len())
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
        self.write(|v| match v.iter_mut().find(|e| e.id == id) {
            Some(e) => e.cell = cell,
            None => v.push(Entry {
                id: id.to_string(),
                cell,
            }),
        })
    }

    /// Replace the whole table with `ids`, none of them running (a supervisor (re)starting).
    pub(crate) fn reset<'a>(&self, ids: impl Iterator<Item = &'a str>) {
        let fresh: Vec<Entry> = ids
            .map(|id| Entry {
                id: id.to_string(),
                cell: None,
            })
            .collect();
        self.write(|v| *v = fresh)
    }

    /// Forget child `id`.
    pub(crate) fn remove(&self, id: &str) {
        self.write(|v| v.retain(|e| e.id != id))
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

impl<M: Message> ChildHandle<M> {
    /// The child id this handle resolves.
    pub fn id(&self) -> &str {
        &self.id
    }

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

//! [`ChildId`]: a child of the node's tree named together with the messages it takes. Each
//! actor's module declares its own (`event_bus::EVENT_BUS`, `connection_pool::CONNECTION_POOL`,
//! ...), so a lookup names the child once and gets a handle of the right message type, where
//! a string id and a separately written type parameter could disagree.

use std::marker::PhantomData;

use ractor::{ActorRef, Message};
use supervisors::SupervisorRef;

/// The id of a tree child whose actor takes `M`.
pub struct ChildId<M> {
    name: &'static str,
    msg: PhantomData<fn() -> M>,
}

impl<M> ChildId<M> {
    /// The child named `name` (its id in the supervisor).
    pub(crate) const fn new(name: &'static str) -> Self {
        Self {
            name,
            msg: PhantomData,
        }
    }

    /// The id the supervisor knows the child by.
    pub(crate) const fn name(&self) -> &'static str {
        self.name
    }
}

impl<M: Message> ChildId<M> {
    /// The child's current actor in `tree`, if it runs.
    pub(crate) fn in_tree(&self, tree: &SupervisorRef) -> Option<ActorRef<M>> {
        tree.which_child::<M>(self.name)
    }
}

// Manual impls: a derive would ask the same of `M`, which message enums need not be.
impl<M> Clone for ChildId<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for ChildId<M> {}

impl<M> std::fmt::Debug for ChildId<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

"""What a context owns besides its Vulkan handles: the objects made through it and its extensions.

Each context holds one :class:`Owned` (``ctx.owned``). Every closable object of this package
(buffers, kernels, sequences, pools) registers itself with :meth:`Owned.adopt` when made and
:meth:`Owned.forget` when it closes itself; ``Context.close()`` closes whatever is still open,
newest first, before the device. An extension is state that other modules keep per context
(the buffer pool, the scan engine, the runtime's staging buffer and one-shot sequence):
``ctx.owned.extension(name, factory)`` makes it on first use and hands the same object after. So
no module keeps a dict keyed by a context, and a lost or abandoned context takes it all along.
"""

from __future__ import annotations


class Owned:
    """The objects one context owns (``ctx.owned``); ``len()`` is how many are open."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._children: dict[int, object] = {}   # id -> object with close(); insertion order = creation order
        self._extensions: dict = {}              # name -> the object extension() made

    def extension(self, key: str, factory=None):
        """The object ``factory(ctx)`` made the first time ``key`` is asked for on this context,
        and the same object after (the buffer pool, the scan engine): state that lives exactly as
        long as the context. It must register itself with :meth:`adopt` to be closed with the
        context. Without ``factory``: the object if made, else None. Raises DeviceLost /
        RuntimeError when the context is not usable and the object must be made."""
        obj = self._extensions.get(key)
        if obj is not None or factory is None:
            return obj
        ctx = self._ctx
        with ctx.lock:
            obj = self._extensions.get(key)
            if obj is None:
                ctx.check_usable()
                obj = self._extensions[key] = factory(ctx)
            return obj

    def adopt(self, obj) -> None:
        """Register an object with ``close()`` so that closing the context closes it. Raises
        DeviceLost / RuntimeError when the context is not usable."""
        ctx = self._ctx
        with ctx.lock:
            ctx.check_usable()
            self._children[id(obj)] = obj

    def forget(self, obj) -> None:
        """Undo :meth:`adopt` (the object closed itself)."""
        with self._ctx.lock:
            self._children.pop(id(obj), None)

    def __len__(self) -> int:
        return len(self._children)

    def close(self) -> None:
        """Close every object still open, newest first, and drop the extensions (Context.close,
        once nothing runs on the device any more)."""
        for child in reversed(list(self._children.values())):
            child.close()
        self._children.clear()
        self._extensions.clear()


class Slot:
    """One closable object a module keeps per context (``ctx.owned.extension(name, Slot)``: the
    reusable staging buffer, the one-shot sequence): ``obj`` (None until the module makes it),
    closed with the context; ``clear()`` closes it early."""

    def __init__(self, ctx):
        self.ctx, self.obj = ctx, None
        ctx.owned.adopt(self)

    def clear(self) -> None:
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    def close(self) -> None:
        self.clear()
        self.ctx.owned.forget(self)

"""The op families of `ember.tensor.Tensor`, one mixin per file; `Tensor` inherits them all."""

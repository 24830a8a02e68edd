//! The driver against a model controller.

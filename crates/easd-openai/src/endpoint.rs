//! Which endpoint a request came through. Its own module, below both errors and responses, so that neither of
//! those depends on the other for it.

/// Which endpoint a request came through: field names in messages and the response objects follow its vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

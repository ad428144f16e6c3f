//! Eviction, pure (DESIGN.md section 4): [`plan::step`] decides, for one
//! Eviction, which VM moves next, which migration is stuck and what every
//! VM's record says. The shell that runs it against Nova (the Eviction and
//! Migration controllers) is issue 6's remaining work.

pub mod plan;

//! Unwind-safe record-batch streams: a panic while a stream is polled becomes
//! a typed error, not the end of the process.
//!
//! Decoders can panic on corrupt input that passes every check dpflow can do
//! before reading: the Parquet reader (59.x) panics in `arrow-buffer` on a
//! data page whose definition levels run past their buffer
//! (`fuzz/corpus/parquet/parquet-data-page-bit-chunk-out-of-bounds.parquet`).
//! Such a panic happens after the data was opened, so in a DP run the charge
//! is already committed; what must not happen is a crash that leaves a
//! reservation for `budget resolve`, or a message quoting the data.
//! [`catch_unwind`] wraps a stream so that the panic turns into
//! [`EnginePanic`], which carries only where the panic happened, and the
//! caller fails the release the ordinary way (charged, message withheld).
//!
//! The location comes from the process's panic hook: [`install_hook`] wraps
//! whatever hook is installed (the binary's, or libFuzzer's, which aborts) so
//! that a panic raised while a guarded stream is being polled on this thread
//! is recorded silently, and every other panic goes to the previous hook.
//! A panic in a task spawned on another thread is not guarded here; tokio
//! catches it and DataFusion either reports it as an error or resumes the
//! unwind in the thread that joins the task, which is inside the guard (a
//! resumed unwind does not call the hook).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;

thread_local! {
    /// How many guarded polls are on this thread's stack.
    static GUARDED: Cell<u32> = const { Cell::new(0) };
    /// Where the last guarded panic on this thread happened.
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic caught while a stream was polled. Only the source location is
/// kept: a panic's message can quote the data it failed on.
#[derive(Debug, thiserror::Error)]
#[error(
    "the engine panicked{} while reading or processing the input (a bug, most likely in a decoder meeting a \
     corrupt file; its message is withheld because it may quote the data). Check the input file (for Parquet, \
     rewrite it with a current writer), and report the location",
    location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default()
)]
pub struct EnginePanic {
    /// `file:line` of the panic, when the hook recorded it.
    pub location: Option<String>,
}

/// Installs (once per process) a panic hook in front of the current one:
/// panics inside a guarded poll on this thread only record their location;
/// all others go to the hook that was installed before. Call it after
/// installing your own hook.
pub fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) > 0 {
                let at = info.location().map(|l| format!("{}:{}", short_path(l.file()), l.line()));
                LOCATION.with(|slot| *slot.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// A source path as a report needs it: a file in a crate from the registry
/// loses the machine's registry directory (`arrow-buffer-59.3.2/src/…`).
pub fn short_path(file: &str) -> &str {
    match file.find("/registry/src/") {
        Some(i) => {
            let rest = &file[i + "/registry/src/".len()..];
            rest.split_once('/').map_or(rest, |(_, crate_path)| crate_path)
        }
        None => file,
    }
}

/// Wraps `stream` so that a panic in `poll_next` ends the stream with one
/// [`EnginePanic`] error (as `DataFusionError::External`). The inner stream
/// is dropped at that point: its state after a panic is unknown.
pub fn catch_unwind(stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    Box::pin(CatchUnwind { schema: stream.schema(), inner: Some(stream) })
}

/// Runs `f` as a guarded section: a panic in it returns [`EnginePanic`].
pub fn guarded<T>(f: impl FnOnce() -> T) -> std::result::Result<T, EnginePanic> {
    GUARDED.with(|g| g.set(g.get() + 1));
    let out = std::panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    out.map_err(caught)
}

fn caught(payload: Box<dyn Any + Send>) -> EnginePanic {
    // The payload (the message) is dropped unread.
    drop(payload);
    EnginePanic { location: LOCATION.with(|slot| slot.borrow_mut().take()) }
}

/// Runs a DataFusion future (planning, `collect`) so that a panic while it
/// is polled on this thread becomes a [`EnginePanic`] error: planning reads
/// file metadata (statistics, schemas) and can meet the same corrupt input
/// as a scan.
pub async fn catch_unwind_future<T>(f: impl Future<Output = Result<T>>) -> Result<T> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(move |cx| match guarded(|| f.as_mut().poll(cx)) {
        Ok(poll) => poll,
        Err(panic) => Poll::Ready(Err(DataFusionError::External(Box::new(panic)))),
    })
    .await
}

struct CatchUnwind {
    schema: SchemaRef,
    inner: Option<SendableRecordBatchStream>,
}

impl Stream for CatchUnwind {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        match guarded(|| inner.as_mut().poll_next(cx)) {
            Ok(poll) => poll,
            Err(panic) => {
                self.inner = None;
                Poll::Ready(Some(Err(DataFusionError::External(Box::new(panic)))))
            }
        }
    }
}

impl RecordBatchStream for CatchUnwind {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;
    use std::sync::Arc;

    fn batches(panic_at: usize) -> SendableRecordBatchStream {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let s = schema.clone();
        let stream = futures::stream::iter(0..3).map(move |i| {
            if i == panic_at {
                panic!("secret value 1234 at row {i}");
            }
            Ok(RecordBatch::try_new(s.clone(), vec![Arc::new(Int64Array::from(vec![i as i64]))])?)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }

    #[tokio::test]
    async fn a_panicking_stream_ends_with_one_error_that_names_only_the_location() {
        install_hook();
        let out: Vec<_> = catch_unwind(batches(1)).collect().await;
        assert_eq!(out.len(), 2, "one batch, then the error, then the end");
        assert!(out[0].is_ok());
        let err = out[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("panicked at"), "{err}");
        assert!(err.contains("unwind.rs"), "the location is the panic's: {err}");
        assert!(!err.contains("1234") && !err.contains("at row"), "the message is withheld: {err}");
    }

    #[tokio::test]
    async fn a_stream_that_does_not_panic_passes_through() {
        let out: Vec<_> = catch_unwind(batches(usize::MAX)).collect().await;
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|b| b.is_ok()));
        assert_eq!(GUARDED.with(Cell::get), 0);
    }

    #[tokio::test]
    async fn a_panicking_future_is_an_error() {
        install_hook();
        let r: Result<u32> = catch_unwind_future(async { panic!("value 99") }).await;
        let e = r.unwrap_err().to_string();
        assert!(e.contains("panicked at") && !e.contains("99"), "{e}");
        assert_eq!(catch_unwind_future(async { Ok(7) }).await.unwrap(), 7);
    }

    #[test]
    fn registry_paths_are_shortened_to_the_crate() {
        let f = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/arrow-buffer-59.3.2/src/util/x.rs";
        assert_eq!(short_path(f), "arrow-buffer-59.3.2/src/util/x.rs");
        assert_eq!(short_path("udfs/src/unwind.rs"), "udfs/src/unwind.rs");
    }

    #[test]
    fn guarded_sections_nest_and_unwind_their_count() {
        install_hook();
        let r = guarded(|| guarded(|| panic!("inner")).is_err());
        assert_eq!(r.ok(), Some(true));
        assert_eq!(GUARDED.with(Cell::get), 0);
    }
}

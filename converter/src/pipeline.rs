//! Writing a conversion's tensors: the calling thread produces tensor i + 1 (its threads
//! quantizing rows) while a writer thread writes tensor i, and a syncer thread syncs the
//! file every [`SYNC_EVERY`] bytes, so that the disk keeps pace with the file instead of
//! receiving all of it in the final sync (1.4 s of an 8.6 s re-quantization to Q8_0 when
//! it did) without the writer ever waiting for the disk. Output buffers are recycled (at
//! most [`BUFFERS`] exist), so their pages are faulted in once, not once per tensor.

use std::sync::mpsc;

use duet_quant::gguf::GgufDataWriter;

use crate::error::ConvertError;

/// Bytes written between two syncs of the output.
const SYNC_EVERY: u64 = 256 << 20;

/// Output buffers in use at once: one being produced, one queued, one being written.
const BUFFERS: usize = 3;

/// Writes `tensors`, in order, into `data` (each under its `name`), each one's bytes made by
/// `produce` (into a recycled buffer it must fill with exactly the tensor's bytes), then
/// finishes the file. On any error the writer is dropped unfinished, which removes its
/// temporary file.
pub fn write_all<T: Sync>(
    data: GgufDataWriter,
    tensors: &[T],
    name: fn(&T) -> &str,
    mut produce: impl FnMut(&T, &mut Vec<u8>) -> Result<(), ConvertError>,
) -> Result<(), ConvertError> {
    std::thread::scope(|s| {
        let (full_tx, full_rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(1);
        let (empty_tx, empty_rx) = mpsc::channel::<Vec<u8>>();
        // At most one sync waiting: when the disk is behind, the writer does not queue more.
        let (sync_tx, sync_rx) = mpsc::sync_channel::<()>(1);
        let mut data = data;
        let handle = data.sync_handle()?;
        let syncer = s.spawn(move || -> std::io::Result<()> {
            for () in sync_rx {
                handle.sync_data()?;
            }
            Ok(())
        });
        let writer = s.spawn(move || -> Result<GgufDataWriter, ConvertError> {
            let mut unsynced = 0u64;
            for (i, bytes) in full_rx {
                data.write_tensor(name(&tensors[i]), &bytes)?;
                unsynced += bytes.len() as u64;
                if unsynced >= SYNC_EVERY {
                    data.flush()?;
                    let _ = sync_tx.try_send(());
                    unsynced = 0;
                }
                // The producer may already have finished; then the buffer is just freed.
                let _ = empty_tx.send(bytes);
            }
            Ok(data)
        });
        let mut made = 0;
        let mut produced = Ok(());
        for (i, t) in tensors.iter().enumerate() {
            let mut buf = match empty_rx.try_recv() {
                Ok(b) => b,
                Err(_) if made < BUFFERS => {
                    made += 1;
                    Vec::new()
                }
                // Wait for the writer to hand one back; if it has stopped (an error), stop too.
                Err(_) => match empty_rx.recv() {
                    Ok(b) => b,
                    Err(_) => break,
                },
            };
            if let Err(e) = produce(t, &mut buf) {
                produced = Err(e);
                break;
            }
            if full_tx.send((i, buf)).is_err() {
                break; // the writer failed: its error is returned below
            }
        }
        drop(full_tx);
        let written = writer.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        // The writer has dropped its end of the sync queue: the syncer ends too.
        let synced = syncer.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        // A production error comes first: the writer only stopped because of it.
        produced?;
        let data = written?;
        synced.map_err(|e| ConvertError::io(data.temp_path(), e))?;
        data.finish()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use duet_quant::GgmlType;
    use duet_quant::gguf::GgufWriter;

    use super::*;

    /// A fresh directory and a GGUF writer of `dir/out.gguf` for `n` F32 tensors of 64
    /// values, named t0, t1, …, with their names.
    fn case(tag: &str, n: usize) -> (PathBuf, GgufDataWriter, Vec<String>) {
        let dir = std::env::temp_dir().join(format!("duet-pipeline-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let mut w = GgufWriter::new(dir.join("out.gguf"));
        for name in &names {
            w.add_tensor(name.clone(), &[64], GgmlType::F32).unwrap();
        }
        (dir, w.start().unwrap(), names)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn tensor_name(t: &String) -> &str {
        t
    }

    /// Every tensor arrives, in order, with its own bytes, whichever recycled buffer carried it.
    #[test]
    fn tensors_are_written_in_order() {
        let (dir, data, names) = case("ok", 9);
        write_all(data, &names, tensor_name, |t, buf| {
            let i: u8 = t[1..].parse().unwrap();
            buf.clear();
            buf.resize(256, i);
            Ok(())
        })
        .unwrap();
        let f = duet_quant::gguf::GgufFile::open(dir.join("out.gguf")).unwrap();
        for (i, t) in f.tensors().iter().enumerate() {
            assert_eq!(t.name(), names[i]);
            assert!(f.tensor_data(t).iter().all(|&b| b == i as u8), "{}", t.name());
        }
        assert_eq!(listing(&dir), ["out.gguf"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A tensor that cannot be produced stops the file: the error comes back and neither
    /// the output nor the temporary file is left, though earlier tensors were written.
    #[test]
    fn a_failed_tensor_leaves_no_file() {
        let (dir, data, names) = case("fail", 6);
        let e = write_all(data, &names, tensor_name, |t, buf| {
            if t == "t4" {
                return Err(ConvertError::shape("t4 is broken"));
            }
            buf.clear();
            buf.resize(256, 1);
            Ok(())
        })
        .unwrap_err();
        assert!(e.to_string().contains("t4 is broken"), "{e}");
        assert!(listing(&dir).is_empty(), "left {:?}", listing(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

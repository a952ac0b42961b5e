//! Large bodies generated as they are sent, never held: xorshift noise (does not compress),
//! or its hexadecimal text (compresses to about half, so CouchDB stores it gzip-encoded).
//! Self-contained so that the benches include it with `#[path]`.

use bytes::Bytes;

const CHUNK: usize = 1 << 20;

/// `len` bytes of noise, or with `hex` its hexadecimal text, in 1 MiB chunks.
pub fn generated(len: u64, hex: bool) -> reqwest::Body {
    let chunks = len.div_ceil(CHUNK as u64);
    let stream = futures::stream::unfold(
        (0u64, 0x2545_f491_4f6c_dd1du64),
        move |(i, mut x)| async move {
            if i == chunks {
                return None;
            }
            let n = CHUNK.min((len - i * CHUNK as u64) as usize);
            let mut buf = Vec::with_capacity(n + 16);
            while buf.len() < n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if hex {
                    buf.extend_from_slice(format!("{x:016x}").as_bytes());
                } else {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
            buf.truncate(n);
            Some((Ok::<Bytes, std::io::Error>(Bytes::from(buf)), (i + 1, x)))
        },
    );
    reqwest::Body::wrap_stream(stream)
}

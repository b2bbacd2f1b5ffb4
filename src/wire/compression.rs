//! The compressed protocol (`CLIENT_COMPRESS`, and MySQL's zstd variant): its 7-byte headers and payloads
//! inflated as far as their bytes go. Like every parser of wire bytes, it never panics on what it is given.

/// The compressed protocol's packet header: 3 bytes of length, 1 of sequence, 3 of the length inflated (0: the
/// payload is sent as is).
pub const COMPRESSED_HEADER: usize = 7;

/// A zstd frame's first bytes.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The largest zstd window a frame may ask for: a packet is at most 16 MiB.
const ZSTD_MAX_WINDOW: u64 = 1 << 24;

/// A compressed payload's beginning inflated, as far as its bytes go and at most `inflated_len` bytes: zlib (the
/// compressed protocol's default) or a zstd frame (MySQL's other algorithm), told apart by their first bytes. zlib
/// inflates byte by byte; zstd by blocks, so that a frame cut within its first block gives nothing. `None` if its
/// first bytes do not inflate.
pub fn inflate_prefix(deflated: &[u8], inflated_len: usize) -> Option<Vec<u8>> {
    if deflated.starts_with(&ZSTD_MAGIC) {
        return zstd_prefix(deflated, inflated_len);
    }
    let mut z = flate2::Decompress::new(true);
    let mut out = Vec::with_capacity(inflated_len.min(1 << 20));
    let mut input = deflated;
    while out.len() < inflated_len {
        let (before_in, before_out) = (z.total_in(), z.total_out());
        out.reserve((inflated_len - out.len()).min(64 << 10));
        let status = z
            .decompress_vec(input, &mut out, flate2::FlushDecompress::None)
            .ok()?;
        input = &deflated[usize::try_from(z.total_in()).ok()?.min(deflated.len())..];
        let stuck = z.total_in() == before_in && z.total_out() == before_out;
        if status == flate2::Status::StreamEnd || stuck {
            break;
        }
    }
    out.truncate(inflated_len);
    (!out.is_empty()).then_some(out)
}

fn zstd_prefix(frame: &[u8], inflated_len: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut input = frame;
    let decoder =
        ruzstd::decoding::StreamingDecoder::new_with_max_window_size(&mut input, ZSTD_MAX_WINDOW)
            .ok()?;
    let mut out = Vec::with_capacity(inflated_len.min(1 << 20));
    // A frame cut short ends in an error, after the blocks that came whole.
    let _ = decoder.take(inflated_len as u64).read_to_end(&mut out);
    (!out.is_empty()).then_some(out)
}

/// The classic packets that compressed-protocol packets carry (`bytes`: their headers and payloads, maybe cut
/// short): payloads sent as is copied, deflated ones inflated as far as their bytes go.
pub fn uncompressed_stream(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(header) = rest.first_chunk::<COMPRESSED_HEADER>() {
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let inflated = u32::from_le_bytes([header[4], header[5], header[6], 0]) as usize;
        let payload = &rest[COMPRESSED_HEADER..(COMPRESSED_HEADER + len).min(rest.len())];
        if inflated == 0 {
            out.extend_from_slice(payload);
        } else {
            match inflate_prefix(payload, inflated) {
                Some(p) => out.extend(p),
                None => break,
            }
        }
        if payload.len() < len {
            break;
        }
        rest = &rest[COMPRESSED_HEADER + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::protocol::COM_QUERY;

    #[test]
    fn compressed_packets_give_their_classic_packets_deflated_or_not_and_cut_short() {
        use std::io::Write;
        let classic = |text: &str| {
            let mut p = (text.len() as u32 + 1).to_le_bytes()[..3].to_vec();
            p.push(0);
            p.push(COM_QUERY);
            p.extend(text.as_bytes());
            p
        };
        let compressed = |payload: &[u8], inflated: usize| {
            let mut p = (payload.len() as u32).to_le_bytes()[..3].to_vec();
            p.push(0);
            p.extend(&(inflated as u32).to_le_bytes()[..3]);
            p.extend(payload);
            p
        };
        let long = classic(&"SELECT 'deflated', ".repeat(200));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&long).unwrap();
        let deflated = z.finish().unwrap();
        let short = classic("SELECT 1");
        let mut stream = compressed(&short, 0);
        stream.extend(compressed(&deflated, long.len()));
        let mut both = short.clone();
        both.extend(&long);
        assert_eq!(uncompressed_stream(&stream), both);
        // Cut short: as much as the bytes kept give.
        let cut = uncompressed_stream(&stream[..stream.len() - deflated.len() / 2]);
        assert!(
            cut.len() > short.len() && both.starts_with(&cut),
            "{}",
            cut.len()
        );
        assert_eq!(inflate_prefix(&deflated, 10).unwrap(), long[..10]);
        // zstd (MySQL's other algorithm): told by its magic; a frame cut within its block gives nothing.
        let zstd = ruzstd::encoding::compress_to_vec(
            &long[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert_eq!(inflate_prefix(&zstd, long.len()).unwrap(), long);
        assert_eq!(inflate_prefix(&zstd, 10).unwrap(), long[..10]);
        let mut zstd_stream = compressed(&short, 0);
        zstd_stream.extend(compressed(&zstd, long.len()));
        assert_eq!(uncompressed_stream(&zstd_stream), both);
        assert_eq!(inflate_prefix(&zstd[..zstd.len() - 1], 100), None);
        assert_eq!(inflate_prefix(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0], 100), None);
    }
}

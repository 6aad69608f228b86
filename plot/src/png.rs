//! A PNG encoder for 8-bit RGB images: signature, IHDR, one zlib IDAT, IEND. Plotters draws
//! into an RGB buffer; encoding it here with flate2 avoids the `image` crate and its codecs.

use std::io::Write;

use flate2::Crc;
use flate2::write::ZlibEncoder;

/// The 8 bytes every PNG file starts with.
pub const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// `rgb` (`width * height * 3` bytes, rows top to bottom) as a PNG file.
pub fn encode(width: u32, height: u32, rgb: &[u8]) -> std::io::Result<Vec<u8>> {
    let stride = width as usize * 3;
    debug_assert_eq!(rgb.len(), stride * height as usize);
    let mut out = SIGNATURE.to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    // Bit depth 8, colour type 2 (RGB), deflate, adaptive filtering, no interlace.
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &header);
    let mut encoder = ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    for row in rgb.chunks(stride.max(1)) {
        // Filter type 1 (Sub): each byte minus the one a pixel to its left. Charts are mostly
        // flat colour, which this turns into runs of zeros.
        let mut filtered = Vec::with_capacity(stride + 1);
        filtered.push(1);
        for (i, byte) in row.iter().enumerate() {
            let left = if i >= 3 { row[i - 3] } else { 0 };
            filtered.push(byte.wrapping_sub(left));
        }
        encoder.write_all(&filtered)?;
    }
    chunk(&mut out, b"IDAT", &encoder.finish()?);
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_two_pixel_image_has_the_known_chunks() {
        let png = encode(2, 1, &[255, 0, 0, 0, 0, 255]).unwrap();
        assert_eq!(png[..8], SIGNATURE);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 2);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 1);
        // IHDR's CRC of a 2x1 RGB image, as any PNG library computes it.
        assert_eq!(png[29..33], [0x7b, 0x40, 0xe8, 0xdd]);
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
    }
}

//! NumPy's `.npy` format (version 1.0) for f32 arrays, so scripts can load raw attention
//! maps with `numpy.load`.

/// The bytes of a little-endian f32 array of `shape` (C order) holding `data`.
pub fn to_npy(shape: &[usize], data: &[f32]) -> Vec<u8> {
    assert_eq!(shape.iter().product::<usize>(), data.len(), "npy shape does not match the data");
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    // A 1-D shape needs the trailing comma of a Python tuple.
    let tuple = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    // magic (6) + version (2) + header length (2) + header + '\n', padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_describes_the_array() {
        let b = to_npy(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)") && header.ends_with('\n'), "{header}");
        assert_eq!(b.len(), 10 + hlen + 24);
        assert_eq!(f32::from_le_bytes(b[10 + hlen + 20..].try_into().unwrap()), 5.0);
    }
}

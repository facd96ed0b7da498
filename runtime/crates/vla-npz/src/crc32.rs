//! CRC-32 (IEEE 802.3, reflected, as zip uses it), slicing-by-8 so verifying large golden
//! tensors costs little next to reading them.

const POLYNOMIAL: u32 = 0xEDB8_8320;

const TABLES: [[u32; 256]; 8] = build_tables();

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                POLYNOMIAL ^ (crc >> 1)
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][byte] = crc;
        byte += 1;
    }
    let mut byte = 0;
    while byte < 256 {
        let mut slice = 1;
        while slice < 8 {
            let previous = tables[slice - 1][byte];
            tables[slice][byte] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            slice += 1;
        }
        byte += 1;
    }
    tables
}

/// Incremental CRC-32 over several slices (a `.npy` header, then its data).
#[derive(Clone, Copy)]
pub(crate) struct Crc32(u32);

impl Crc32 {
    pub fn new() -> Crc32 {
        Crc32(!0)
    }

    pub fn update(&mut self, data: &[u8]) {
        let t = &TABLES;
        let mut crc = self.0;
        let mut chunks = data.chunks_exact(8);
        for chunk in &mut chunks {
            let low = crc ^ u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let high = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
            crc = t[7][(low & 0xFF) as usize]
                ^ t[6][((low >> 8) & 0xFF) as usize]
                ^ t[5][((low >> 16) & 0xFF) as usize]
                ^ t[4][(low >> 24) as usize]
                ^ t[3][(high & 0xFF) as usize]
                ^ t[2][((high >> 8) & 0xFF) as usize]
                ^ t[1][((high >> 16) & 0xFF) as usize]
                ^ t[0][(high >> 24) as usize];
        }
        for &byte in chunks.remainder() {
            crc = t[0][((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8);
        }
        self.0 = crc;
    }

    pub fn finish(self) -> u32 {
        !self.0
    }
}

pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = Crc32::new();
    crc.update(data);
    crc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitwise_reference(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    POLYNOMIAL ^ (crc >> 1)
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn sliced_and_incremental_agree_with_bitwise() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000] {
            assert_eq!(
                crc32(&data[..len]),
                bitwise_reference(&data[..len]),
                "{len}"
            );
            let mut split = Crc32::new();
            split.update(&data[..len / 3]);
            split.update(&data[len / 3..len]);
            assert_eq!(split.finish(), bitwise_reference(&data[..len]), "{len}");
        }
    }
}

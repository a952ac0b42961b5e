//! Stored passwords as CouchDB writes them in `[admins]`: `-pbkdf2:PRF-KEY,SALT,ITERATIONS`
//! (CouchDB 3.4, PRF `sha256` by default; also `sha`, `sha224`, `sha384`, `sha512`), the
//! older `-pbkdf2-KEY,SALT,ITERATIONS` (PBKDF2-HMAC-SHA1) and `-hashed-SHA1HEX,SALT` (the
//! `simple` scheme). KEY is the hex derived key, as long as the PRF's output; SALT is used as
//! the text it is. A plain entry is hashed at start ([`StoredPassword::hash_plain`]), so no
//! password is kept in clear. `Debug` shows the scheme only.

use rand::RngCore as _;
use sha1::{Digest as _, Sha1};

/// The PRF of a PBKDF2 hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prf {
    /// HMAC-SHA-1 (CouchDB before 3.4: `-pbkdf2-` without a PRF name).
    Sha1,
    /// HMAC-SHA-224.
    Sha224,
    /// HMAC-SHA-256 (CouchDB 3.4's default, `-pbkdf2:sha256-`).
    Sha256,
    /// HMAC-SHA-384.
    Sha384,
    /// HMAC-SHA-512.
    Sha512,
}

impl Prf {
    /// From CouchDB's `pbkdf2_prf` names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "sha" => Self::Sha1,
            "sha224" => Self::Sha224,
            "sha256" => Self::Sha256,
            "sha384" => Self::Sha384,
            "sha512" => Self::Sha512,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha",
            Self::Sha224 => "sha224",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    fn out_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha224 => 28,
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// OpenSSL's PBKDF2 when it is linked (feature `tls`): the generic Rust one is
    /// instantiated in this crate, so a debug build runs CouchDB's 600,000 rounds in ~5 s
    /// instead of ~0.2 s, at every start with a plain admin and at every first login.
    #[cfg(feature = "tls")]
    fn derive(self, password: &[u8], salt: &[u8], rounds: u32, out: &mut [u8]) {
        use openssl::hash::MessageDigest;
        let md = match self {
            Self::Sha1 => MessageDigest::sha1(),
            Self::Sha224 => MessageDigest::sha224(),
            Self::Sha256 => MessageDigest::sha256(),
            Self::Sha384 => MessageDigest::sha384(),
            Self::Sha512 => MessageDigest::sha512(),
        };
        let rounds = usize::try_from(rounds).unwrap_or(usize::MAX);
        if openssl::pkcs5::pbkdf2_hmac(password, salt, rounds, md, out).is_err() {
            // Out of memory inside OpenSSL: a key no password can match.
            out.fill(0);
            out[0] = 1;
        }
    }

    #[cfg(not(feature = "tls"))]
    fn derive(self, password: &[u8], salt: &[u8], rounds: u32, out: &mut [u8]) {
        use hmac::Hmac;
        use pbkdf2::pbkdf2;
        use sha2::{Sha224, Sha256, Sha384, Sha512};
        // `pbkdf2` only fails for output lengths HMAC cannot produce, which `out_len` rules out.
        let _ = match self {
            Self::Sha1 => pbkdf2::<Hmac<Sha1>>(password, salt, rounds, out),
            Self::Sha224 => pbkdf2::<Hmac<Sha224>>(password, salt, rounds, out),
            Self::Sha256 => pbkdf2::<Hmac<Sha256>>(password, salt, rounds, out),
            Self::Sha384 => pbkdf2::<Hmac<Sha384>>(password, salt, rounds, out),
            Self::Sha512 => pbkdf2::<Hmac<Sha512>>(password, salt, rounds, out),
        };
    }
}

/// The most iterations a stored hash may ask for (CouchDB's `max_iterations` default).
/// The most PBKDF2 rounds a stored hash may ask for (a bound on the work per login).
pub const MAX_ITERATIONS: u32 = 1_000_000_000;

/// A password as stored in configuration.
#[derive(Clone, PartialEq, Eq)]
pub enum StoredPassword {
    /// PBKDF2 with a PRF.
    Pbkdf2 {
        /// The pseudo-random function.
        prf: Prf,
        /// The derived key.
        key: Vec<u8>,
        /// The salt, as CouchDB writes it.
        salt: String,
        /// PBKDF2 rounds.
        iterations: u32,
    },
    /// CouchDB's `simple` scheme: hex SHA-1 of password followed by salt.
    Simple {
        /// SHA-1 of the password followed by the salt.
        hash: Vec<u8>,
        /// The salt.
        salt: String,
    },
}

impl std::fmt::Debug for StoredPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pbkdf2 {
                prf, iterations, ..
            } => write!(f, "Pbkdf2({}, {iterations})", prf.name()),
            Self::Simple { .. } => f.write_str("Simple"),
        }
    }
}

/// Why a configured entry cannot be used. Never contains the entry itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// It starts like a CouchDB hash but is not one.
    #[error("not a valid CouchDB password hash ({0})")]
    Malformed(&'static str),
}

impl StoredPassword {
    /// Reads a configured value: a CouchDB hash, or `None` for a plain password.
    pub fn parse(v: &str) -> Result<Option<Self>, PasswordError> {
        if let Some(rest) = v.strip_prefix("-hashed-") {
            let (hash, salt) = rest
                .split_once(',')
                .ok_or(PasswordError::Malformed("-hashed- needs HASH,SALT"))?;
            let hash =
                hex::decode(hash).map_err(|_| PasswordError::Malformed("hash is not hex"))?;
            return Ok(Some(Self::Simple {
                hash,
                salt: salt.to_owned(),
            }));
        }
        let (prf, rest) = if let Some(rest) = v.strip_prefix("-pbkdf2-") {
            (Prf::Sha1, rest)
        } else if let Some(rest) = v.strip_prefix("-pbkdf2:") {
            let (name, rest) = rest
                .split_once('-')
                .ok_or(PasswordError::Malformed("-pbkdf2:PRF- expected"))?;
            let prf = Prf::parse(name).ok_or(PasswordError::Malformed("unknown PRF"))?;
            (prf, rest)
        } else {
            return Ok(None);
        };
        let mut parts = rest.split(',');
        let (Some(key), Some(salt), Some(iter), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(PasswordError::Malformed("KEY,SALT,ITERATIONS expected"));
        };
        let key = hex::decode(key).map_err(|_| PasswordError::Malformed("key is not hex"))?;
        if key.is_empty() || key.len() > prf.out_len() {
            return Err(PasswordError::Malformed("key length does not fit the PRF"));
        }
        let iterations = iter
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_ITERATIONS).contains(n))
            .ok_or(PasswordError::Malformed("iterations out of range"))?;
        Ok(Some(Self::Pbkdf2 {
            prf,
            key,
            salt: salt.to_owned(),
            iterations,
        }))
    }

    /// Hashes a plain password as CouchDB does at start: PBKDF2 with `prf`, a random 32-hex-digit
    /// salt and `iterations`.
    pub fn hash_plain(password: &str, prf: Prf, iterations: u32) -> Self {
        let mut raw = [0u8; 16];
        rand::rng().fill_bytes(&mut raw);
        let salt = hex::encode(raw);
        let mut key = vec![0u8; prf.out_len()];
        prf.derive(password.as_bytes(), salt.as_bytes(), iterations, &mut key);
        Self::Pbkdf2 {
            prf,
            key,
            salt,
            iterations,
        }
    }

    /// Whether `password` matches (compared without early exit).
    pub fn verify(&self, password: &str) -> bool {
        match self {
            Self::Pbkdf2 {
                prf,
                key,
                salt,
                iterations,
            } => {
                let mut out = vec![0u8; key.len()];
                prf.derive(password.as_bytes(), salt.as_bytes(), *iterations, &mut out);
                same_bytes(&out, key)
            }
            Self::Simple { hash, salt } => {
                let mut h = Sha1::new();
                h.update(password.as_bytes());
                h.update(salt.as_bytes());
                same_bytes(&h.finalize(), hash)
            }
        }
    }

    /// The per-user salt that goes into session cookie signatures.
    pub fn salt(&self) -> &str {
        match self {
            Self::Pbkdf2 { salt, .. } | Self::Simple { salt, .. } => salt,
        }
    }

    /// CouchDB's stored form (what its `local.ini` would hold); tests check `parse` against it.
    #[cfg(test)]
    fn to_couchdb(&self) -> String {
        match self {
            Self::Pbkdf2 {
                prf,
                key,
                salt,
                iterations,
            } => {
                let tag = if *prf == Prf::Sha1 {
                    "-pbkdf2-".to_owned()
                } else {
                    format!("-pbkdf2:{}-", prf.name())
                };
                format!("{tag}{},{salt},{iterations}", hex::encode(key))
            }
            Self::Simple { hash, salt } => format!("-hashed-{},{salt}", hex::encode(hash)),
        }
    }
}

/// Secrets compared in time independent of where they differ (`subtle`; only a length
/// difference returns early, which reveals nothing a fixed-size digest does not).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::Hmac;
    use sha2::{Sha224, Sha256, Sha384, Sha512};

    #[test]
    fn both_pbkdf2_implementations_agree() {
        for prf in [
            Prf::Sha1,
            Prf::Sha224,
            Prf::Sha256,
            Prf::Sha384,
            Prf::Sha512,
        ] {
            let mut a = vec![0u8; prf.out_len()];
            prf.derive(b"pw", b"salt", 3, &mut a);
            let mut b = vec![0u8; prf.out_len()];
            let _ = match prf {
                Prf::Sha1 => pbkdf2::pbkdf2::<Hmac<Sha1>>(b"pw", b"salt", 3, &mut b),
                Prf::Sha224 => pbkdf2::pbkdf2::<Hmac<Sha224>>(b"pw", b"salt", 3, &mut b),
                Prf::Sha256 => pbkdf2::pbkdf2::<Hmac<Sha256>>(b"pw", b"salt", 3, &mut b),
                Prf::Sha384 => pbkdf2::pbkdf2::<Hmac<Sha384>>(b"pw", b"salt", 3, &mut b),
                Prf::Sha512 => pbkdf2::pbkdf2::<Hmac<Sha512>>(b"pw", b"salt", 3, &mut b),
            };
            assert_eq!(a, b, "{prf:?}");
        }
    }

    #[test]
    fn couchdb_3_4_hash_of_admin() {
        // Written by CouchDB 3.4.3 for the password `admin` (its peer script's default admin).
        let h = StoredPassword::parse(
            "-pbkdf2:sha256-760669adacd56c93a318509f4db83a9b92609968c326bef77c28a17224b0be92,\
             f5512f0141077776d790b65dea397196,600000",
        )
        .unwrap()
        .unwrap();
        assert!(h.verify("admin"));
        assert!(!h.verify("Admin"));
        assert_eq!(h.salt(), "f5512f0141077776d790b65dea397196");
        assert_eq!(format!("{h:?}"), "Pbkdf2(sha256, 600000)");
    }

    #[test]
    fn older_forms_and_round_trips() {
        // PBKDF2-HMAC-SHA1 test vector (RFC 6070: "password", "salt", 2 iterations).
        let sha1 = "-pbkdf2-ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957,salt,2";
        let h = StoredPassword::parse(sha1).unwrap().unwrap();
        assert!(h.verify("password") && !h.verify("passwort"));
        assert_eq!(h.to_couchdb(), sha1);
        let simple = format!("-hashed-{},s4lt", hex::encode(Sha1::digest(b"pws4lt")));
        let h = StoredPassword::parse(&simple).unwrap().unwrap();
        assert!(h.verify("pw") && !h.verify("px"));
        let fresh = StoredPassword::hash_plain("s3cret", Prf::Sha256, 10);
        assert!(fresh.verify("s3cret"));
        let again = StoredPassword::parse(&fresh.to_couchdb()).unwrap().unwrap();
        assert_eq!(again, fresh);
        assert!(!fresh.to_couchdb().contains("s3cret"));
    }

    #[test]
    fn plain_and_malformed_entries() {
        assert_eq!(StoredPassword::parse("plain").unwrap(), None);
        for bad in [
            "-pbkdf2-zz,s,1",
            "-pbkdf2-ab,s",
            "-pbkdf2-ab,s,0",
            "-pbkdf2-ab,s,1,2",
            "-pbkdf2:md5-ab,s,1",
            "-hashed-ab",
        ] {
            assert!(StoredPassword::parse(bad).is_err(), "{bad}");
        }
        assert!(same_bytes(b"ab", b"ab") && !same_bytes(b"ab", b"a"));
    }
}

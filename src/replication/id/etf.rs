//! Erlang's external term format (`term_to_binary(T, [{minor_version, 1}])`), only the encoder
//! and only the term shapes a replication id is built from: atoms, binaries, strings (char
//! lists), integers, floats, tuples and lists. CouchDB hashes these bytes to name its
//! checkpoints, so every byte here must be what Erlang/OTP writes.

/// An Erlang term.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// An atom (`undefined`, `remote`, `true`, ...); Latin-1 text.
    Atom(&'static str),
    /// A binary (`<<"...">>`): JSON strings, the server uuid, filter code.
    Bin(Vec<u8>),
    /// A string, i.e. a list of bytes (`"..."`): URLs, hosts, header names, user names.
    Str(Vec<u8>),
    /// An integer of any size.
    Int(i128),
    /// A float.
    Float(f64),
    /// A tuple.
    Tuple(Vec<Term>),
    /// A proper list.
    List(Vec<Term>),
}

// Tags of the external term format.
const VERSION: u8 = 131;
const NEW_FLOAT_EXT: u8 = 70;
const SMALL_INTEGER_EXT: u8 = 97;
const INTEGER_EXT: u8 = 98;
const ATOM_EXT: u8 = 100;
const SMALL_TUPLE_EXT: u8 = 104;
const LARGE_TUPLE_EXT: u8 = 105;
const NIL_EXT: u8 = 106;
const STRING_EXT: u8 = 107;
const LIST_EXT: u8 = 108;
const BINARY_EXT: u8 = 109;
const SMALL_BIG_EXT: u8 = 110;

/// `term_to_binary(T, [{minor_version, 1}])`.
pub fn term_to_binary(t: &Term) -> Vec<u8> {
    let mut out = vec![VERSION];
    encode(t, &mut out);
    out
}

fn len32(n: usize) -> [u8; 4] {
    // Terms larger than 4 GiB cannot be encoded by Erlang either; they never reach here.
    u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes()
}

fn encode(t: &Term, out: &mut Vec<u8>) {
    match t {
        Term::Atom(a) => {
            out.push(ATOM_EXT);
            out.extend_from_slice(&(a.len() as u16).to_be_bytes());
            out.extend_from_slice(a.as_bytes());
        }
        Term::Bin(b) => {
            out.push(BINARY_EXT);
            out.extend_from_slice(&len32(b.len()));
            out.extend_from_slice(b);
        }
        Term::Str(s) if s.is_empty() => out.push(NIL_EXT),
        Term::Str(s) if s.len() <= usize::from(u16::MAX) => {
            out.push(STRING_EXT);
            out.extend_from_slice(&(s.len() as u16).to_be_bytes());
            out.extend_from_slice(s);
        }
        // Longer char lists are written as ordinary lists of small integers.
        Term::Str(s) => encode_list(s.iter().map(|b| Term::Int(i128::from(*b))), s.len(), out),
        Term::Int(i) => encode_int(*i, out),
        Term::Float(f) => {
            out.push(NEW_FLOAT_EXT);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Term::Tuple(items) => {
            if let Ok(n) = u8::try_from(items.len()) {
                out.extend_from_slice(&[SMALL_TUPLE_EXT, n]);
            } else {
                out.push(LARGE_TUPLE_EXT);
                out.extend_from_slice(&len32(items.len()));
            }
            for i in items {
                encode(i, out);
            }
        }
        Term::List(items) if items.is_empty() => out.push(NIL_EXT),
        Term::List(items) => encode_list(items.iter().cloned(), items.len(), out),
    }
}

fn encode_list(items: impl Iterator<Item = Term>, n: usize, out: &mut Vec<u8>) {
    out.push(LIST_EXT);
    out.extend_from_slice(&len32(n));
    for i in items {
        encode(&i, out);
    }
    out.push(NIL_EXT);
}

fn encode_int(i: i128, out: &mut Vec<u8>) {
    if let Ok(small) = u8::try_from(i) {
        out.extend_from_slice(&[SMALL_INTEGER_EXT, small]);
    } else if let Ok(word) = i32::try_from(i) {
        out.push(INTEGER_EXT);
        out.extend_from_slice(&word.to_be_bytes());
    } else {
        // Little-endian magnitude bytes with a sign byte.
        let mut mag = i.unsigned_abs();
        let mut digits = Vec::new();
        while mag > 0 {
            digits.push((mag & 0xff) as u8);
            mag >>= 8;
        }
        out.extend_from_slice(&[SMALL_BIG_EXT, digits.len() as u8, u8::from(i < 0)]);
        out.extend_from_slice(&digits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(s: &str) -> Term {
        Term::Bin(s.as_bytes().to_vec())
    }
    fn s(s: &str) -> Term {
        Term::Str(s.as_bytes().to_vec())
    }

    /// Known answers printed by `term_to_binary(T, [{minor_version, 1}])` on OTP 25 (the
    /// runtime of CouchDB 3.4.3).
    #[test]
    fn encodings_match_erlang() {
        let cases: Vec<(Term, Vec<u8>)> = vec![
            // [<<"ab">>, "x", ok, {a, 1.5}]
            (
                Term::List(vec![
                    bin("ab"),
                    s("x"),
                    Term::Atom("ok"),
                    Term::Tuple(vec![Term::Atom("a"), Term::Float(1.5)]),
                ]),
                vec![
                    131, 108, 0, 0, 0, 4, 109, 0, 0, 0, 2, 97, 98, 107, 0, 1, 120, 100, 0, 2, 111,
                    107, 104, 2, 100, 0, 1, 97, 70, 63, 248, 0, 0, 0, 0, 0, 0, 106,
                ],
            ),
            // 255, 256, -1, 5984, 2147483648, -2147483649, 18446744073709551615
            (Term::Int(255), vec![131, 97, 255]),
            (Term::Int(256), vec![131, 98, 0, 0, 1, 0]),
            (Term::Int(-1), vec![131, 98, 255, 255, 255, 255]),
            (Term::Int(5984), vec![131, 98, 0, 0, 23, 96]),
            (Term::Int(2147483648), vec![131, 110, 4, 0, 0, 0, 0, 128]),
            (Term::Int(-2147483649), vec![131, 110, 4, 1, 1, 0, 0, 128]),
            (
                Term::Int(18446744073709551615),
                vec![131, 110, 8, 0, 255, 255, 255, 255, 255, 255, 255, 255],
            ),
            // "" and [] and {[]}
            (s(""), vec![131, 106]),
            (Term::List(vec![]), vec![131, 106]),
            (
                Term::Tuple(vec![Term::List(vec![])]),
                vec![131, 104, 1, 106],
            ),
            // -0.25
            (
                Term::Float(-0.25),
                vec![131, 70, 191, 208, 0, 0, 0, 0, 0, 0],
            ),
        ];
        for (t, want) in cases {
            assert_eq!(term_to_binary(&t), want, "{t:?}");
        }
    }

    #[test]
    fn long_strings_and_tuples_use_the_general_forms() {
        // A 65536-byte char list is a LIST_EXT of SMALL_INTEGER_EXTs.
        let b = term_to_binary(&Term::Str(vec![b'a'; 65536]));
        assert_eq!(&b[..6], &[131, 108, 0, 1, 0, 0]);
        assert_eq!(&b[6..8], &[97, b'a']);
        assert_eq!(b.len(), 6 + 2 * 65536 + 1);
        // A 256-element tuple is a LARGE_TUPLE_EXT.
        let t = term_to_binary(&Term::Tuple(vec![Term::Int(0); 256]));
        assert_eq!(&t[..6], &[131, 105, 0, 0, 1, 0]);
    }
}

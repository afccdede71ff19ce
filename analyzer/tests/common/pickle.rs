//! A small unpickler for the memory-viz export's tests: the opcodes of protocols 2 to 4 that
//! the export and PyTorch's snapshots use, into serde-pickle's `Value`.
//!
//! serde-pickle's own reader cannot be used on the export: it counts references to memoized
//! objects once per `BINGET` in the stream, so an object memoized inside another memoized one
//! (a frame dict inside a stack's shared frames list, a string inside a frame dict) runs out
//! of references when the outer one is read a second time, and it fails with `Recursive`.
//! Python's `pickle` reads it (the tests run that too, when python3 is there).
//!
//! The memo keeps a copy of the object on top of the stack when it is memoized, so an object
//! must be complete when it is: the export memoizes only finished objects (strings, frame
//! dicts after their items, frames lists after their frames).

use serde_pickle::{HashableValue, Value};
use std::collections::BTreeMap;

/// Reads `raw`; an error says which opcode at which offset.
pub fn load(raw: &[u8]) -> Result<Value, String> {
    let mut r = Reader {
        raw,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
    };
    r.run()
}

struct Reader<'a> {
    raw: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Vec<Option<Value>>,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.raw.len())
            .ok_or_else(|| format!("cut short at {}", self.pos))?;
        let s = &self.raw[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn pop(&mut self) -> Result<Value, String> {
        self.stack
            .pop()
            .ok_or_else(|| format!("empty stack at {}", self.pos))
    }

    fn top(&mut self) -> Result<&mut Value, String> {
        let at = self.pos;
        self.stack
            .last_mut()
            .ok_or_else(|| format!("empty stack at {at}"))
    }

    fn since_mark(&mut self) -> Result<Vec<Value>, String> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| format!("no mark at {}", self.pos))?;
        if m > self.stack.len() {
            return Err(format!("mark past the stack at {}", self.pos));
        }
        Ok(self.stack.split_off(m))
    }

    fn put(&mut self, i: usize) -> Result<(), String> {
        let v = self.top()?.clone();
        if self.memo.len() <= i {
            self.memo.resize(i + 1, None);
        }
        self.memo[i] = Some(v);
        Ok(())
    }

    fn get(&mut self, i: usize) -> Result<(), String> {
        let v = self
            .memo
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| format!("memo {i} not set at {}", self.pos))?;
        self.stack.push(v);
        Ok(())
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), String> {
        if !items.len().is_multiple_of(2) {
            return Err(format!("odd SETITEMS at {}", self.pos));
        }
        let at = self.pos;
        let Value::Dict(d) = self.top()? else {
            return Err(format!("SETITEMS on a non-dict at {at}"));
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let k: HashableValue = k
                .into_hashable()
                .map_err(|e| format!("unhashable key at {at}: {e}"))?;
            d.insert(k, v);
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), String> {
        let at = self.pos;
        let Value::List(l) = self.top()? else {
            return Err(format!("APPENDS on a non-list at {at}"));
        };
        l.extend(items);
        Ok(())
    }

    fn string(&mut self, n: usize) -> Result<(), String> {
        let at = self.pos;
        let s = std::str::from_utf8(self.take(n)?)
            .map_err(|e| format!("bad UTF-8 at {at}: {e}"))?
            .to_owned();
        self.stack.push(Value::String(s));
        Ok(())
    }

    fn run(&mut self) -> Result<Value, String> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if !(2..=5).contains(&p) {
                        return Err(format!("protocol {p} at {at}"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: its length
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'}' => self.stack.push(Value::Dict(BTreeMap::new())),
                b']' => self.stack.push(Value::List(Vec::new())),
                b')' => self.stack.push(Value::Tuple(Vec::new())),
                b'u' => {
                    let items = self.since_mark()?;
                    self.set_items(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'e' => {
                    let items = self.since_mark()?;
                    self.append(items)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n {
                        return Err(format!("TUPLE{n} on a short stack at {at}"));
                    }
                    let t = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(t));
                }
                b't' => {
                    let t = self.since_mark()?;
                    self.stack.push(Value::Tuple(t));
                }
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'N' => self.stack.push(Value::None),
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(Value::I64(i64::from(v)));
                }
                b'M' => {
                    let b = self.take(2)?;
                    let v = u16::from_le_bytes([b[0], b[1]]);
                    self.stack.push(Value::I64(i64::from(v)));
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    self.stack.push(Value::I64(i64::from(v)));
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    if n > 8 {
                        return Err(format!("LONG1 of {n} bytes at {at}"));
                    }
                    let b = self.take(n)?;
                    let mut v: i64 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= i64::from(x) << (8 * i);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.stack.push(Value::I64(v));
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    self.string(n)?;
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    self.string(n)?;
                }
                0x94 => {
                    let i = self.memo.len();
                    self.put(i)?;
                }
                b'q' => {
                    let i = usize::from(self.u8()?);
                    self.put(i)?;
                }
                b'r' => {
                    let i = self.u32()? as usize;
                    self.put(i)?;
                }
                b'h' => {
                    let i = usize::from(self.u8()?);
                    self.get(i)?;
                }
                b'j' => {
                    let i = self.u32()? as usize;
                    self.get(i)?;
                }
                _ => return Err(format!("opcode 0x{op:02x} at {at} not read here")),
            }
        }
    }
}

//! A small raw NBD client for protocol tests: it speaks the wire format byte by byte so tests
//! can also send what real clients never would.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use zeta::nbd::proto::*;

pub struct Client {
    pub s: TcpStream,
    structured: bool,
    /// Cookie -> length of pending simple-reply reads (their data follows the header).
    reads: HashMap<u64, u32>,
}

#[derive(Debug)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
    /// For BLOCK_STATUS: (length, flags) descriptors, of every chunk in turn.
    pub extents: Vec<(u32, u32)>,
    /// For BLOCK_STATUS: each chunk's context id and its descriptors.
    pub contexts: Vec<(u32, Vec<(u32, u32)>)>,
}

impl Client {
    /// Connects and completes the greeting (fixed newstyle, no zeroes).
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut c = Client {
            s,
            structured: false,
            reads: HashMap::new(),
        };
        let mut g = [0u8; 18];
        c.s.read_exact(&mut g).expect("greeting");
        assert_eq!(u64::from_be_bytes(g[0..8].try_into().unwrap()), NBDMAGIC);
        assert_eq!(u64::from_be_bytes(g[8..16].try_into().unwrap()), IHAVEOPT);
        c.s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        c
    }

    pub fn send_option(&mut self, opt: u32, data: &[u8]) -> std::io::Result<()> {
        let mut m = IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m)
    }

    /// One option reply: (type, data).
    pub fn read_option_reply(&mut self) -> std::io::Result<(u32, Vec<u8>)> {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h)?;
        assert_eq!(
            u64::from_be_bytes(h[0..8].try_into().unwrap()),
            OPT_REPLY_MAGIC
        );
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut d = vec![0u8; len as usize];
        self.s.read_exact(&mut d)?;
        Ok((kind, d))
    }

    /// Sends an option and collects replies up to the final ACK or error.
    pub fn option(&mut self, opt: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        self.send_option(opt, data).expect("send option");
        let mut out = Vec::new();
        loop {
            let (kind, d) = self.read_option_reply().expect("option reply");
            let last = kind == REP_ACK || kind & (1 << 31) != 0;
            out.push((kind, d));
            if last {
                return out;
            }
        }
    }

    pub fn structured(&mut self) {
        let r = self.option(OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(r.last().unwrap().0, REP_ACK);
        self.structured = true;
    }

    pub fn set_meta(&mut self, export: &str) {
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        let r = self.option(OPT_SET_META_CONTEXT, &d);
        assert_eq!(r[0].0, REP_META_CONTEXT, "{r:?}");
        assert_eq!(r.last().unwrap().0, REP_ACK);
    }

    /// NBD_OPT_{LIST,SET}_META_CONTEXT with `queries`: the contexts the server names, as
    /// (id, name).
    pub fn meta_contexts(
        &mut self,
        opt: u32,
        export: &str,
        queries: &[&str],
    ) -> Vec<(u32, String)> {
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        let r = self.option(opt, &d);
        assert_eq!(r.last().unwrap().0, REP_ACK, "{r:?}");
        r.iter()
            .filter(|(k, _)| *k == REP_META_CONTEXT)
            .map(|(_, d)| {
                let id = u32::from_be_bytes(d[0..4].try_into().unwrap());
                (id, String::from_utf8(d[4..].to_vec()).unwrap())
            })
            .collect()
    }

    pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// NBD_OPT_GO: Ok((size, transmission flags)) or Err((error reply type, message)).
    pub fn go(&mut self, name: &str, infos: &[u16]) -> Result<(u64, u16), (u32, String)> {
        let r = self.option(OPT_GO, &Self::info_data(name, infos));
        let (last, msg) = r.last().unwrap();
        if *last != REP_ACK {
            return Err((*last, String::from_utf8_lossy(msg).into()));
        }
        let export = r
            .iter()
            .find(|(k, d)| *k == REP_INFO && d[0..2] == INFO_EXPORT.to_be_bytes())
            .expect("NBD_INFO_EXPORT");
        let d = &export.1;
        Ok((
            u64::from_be_bytes(d[2..10].try_into().unwrap()),
            u16::from_be_bytes(d[10..12].try_into().unwrap()),
        ))
    }

    /// Structured replies, base:allocation, GO: a session ready for every command.
    pub fn open(addr: SocketAddr, export: &str) -> Client {
        let mut c = Client::connect(addr);
        c.structured();
        c.set_meta(export);
        c.go(export, &[]).expect("go");
        c
    }

    pub fn send(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let mut m = request_header(kind, flags, cookie, offset, length).to_vec();
        m.extend_from_slice(payload);
        if kind == CMD_READ {
            self.reads.insert(cookie, length);
        }
        self.s.write_all(&m)
    }

    /// The next reply (structured chunks are read up to the one flagged DONE).
    pub fn recv(&mut self) -> std::io::Result<Reply> {
        let mut reply = Reply {
            cookie: 0,
            error: 0,
            data: Vec::new(),
            extents: Vec::new(),
            contexts: Vec::new(),
        };
        loop {
            let mut m = [0u8; 4];
            self.s.read_exact(&mut m)?;
            match u32::from_be_bytes(m) {
                SIMPLE_REPLY_MAGIC => {
                    let mut h = [0u8; 12];
                    self.s.read_exact(&mut h)?;
                    reply.error = u32::from_be_bytes(h[0..4].try_into().unwrap());
                    reply.cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
                    let len = self.reads.remove(&reply.cookie);
                    if let (Some(len), 0, false) = (len, reply.error, self.structured) {
                        reply.data = vec![0u8; len as usize];
                        self.s.read_exact(&mut reply.data)?;
                    }
                    return Ok(reply);
                }
                STRUCTURED_REPLY_MAGIC => {
                    let mut h = [0u8; 16];
                    self.s.read_exact(&mut h)?;
                    let flags = u16::from_be_bytes(h[0..2].try_into().unwrap());
                    let kind = u16::from_be_bytes(h[2..4].try_into().unwrap());
                    reply.cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
                    let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
                    let mut p = vec![0u8; len as usize];
                    self.s.read_exact(&mut p)?;
                    match kind {
                        REPLY_TYPE_OFFSET_DATA => reply.data.extend_from_slice(&p[8..]),
                        REPLY_TYPE_BLOCK_STATUS => {
                            let id = u32::from_be_bytes(p[0..4].try_into().unwrap());
                            let mut list = Vec::new();
                            for d in p[4..].chunks(8) {
                                let x = (
                                    u32::from_be_bytes(d[0..4].try_into().unwrap()),
                                    u32::from_be_bytes(d[4..8].try_into().unwrap()),
                                );
                                reply.extents.push(x);
                                list.push(x);
                            }
                            reply.contexts.push((id, list));
                        }
                        REPLY_TYPE_ERROR => {
                            reply.error = u32::from_be_bytes(p[0..4].try_into().unwrap())
                        }
                        _ => {}
                    }
                    if flags & REPLY_FLAG_DONE != 0 {
                        self.reads.remove(&reply.cookie);
                        return Ok(reply);
                    }
                }
                other => panic!("bad reply magic {other:#x}"),
            }
        }
    }

    /// Sends one request and waits for its reply.
    pub fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Reply {
        self.send(kind, flags, 7, offset, length, payload)
            .expect("send");
        let r = self.recv().expect("reply");
        assert_eq!(r.cookie, 7);
        r
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.call(CMD_WRITE, 0, offset, data.len() as u32, data)
            .error
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let r = self.call(CMD_READ, 0, offset, len, &[]);
        if r.error != 0 {
            return Err(r.error);
        }
        Ok(r.data)
    }

    /// Whether the server closed the connection (reads end-of-file or a reset).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

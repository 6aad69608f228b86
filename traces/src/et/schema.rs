//! The Chakra execution trace protobuf schema (`ChakraProtoMsg`), written from the published
//! specification: `schema/protobuf/et_def.proto` of mlcommons/chakra at commit
//! 6dc63e147b9d115286626cc122459e44d9d08401 (field numbers and types as published; the
//! storage messages of that file, which no training trace carries, are left out and skipped
//! as unknown fields when read).
//!
//! A `.et` file is a stream of length-delimited messages (a varint length, then the message):
//! one [`GlobalMetadata`], then one [`Node`] per node. Chakra writes one file per rank, named
//! `NAME.RANK.et`. [`read_file`] and [`write_file`] read and write that framing.

// Generated-style message structs: every field is the schema's; the doc comments say what
// Chakra means by each.
#![allow(missing_docs)]

use prost::Message;

/// A named value attached to a node or to the metadata (Chakra's `AttributeProto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// The attribute's name (`comm_type`, `comm_size`, `num_ops`, ...).
    #[prost(string, tag = "1")]
    pub name: String,
    /// Free text.
    #[prost(string, tag = "2")]
    pub doc_string: String,
    /// The value, of one of the schema's types.
    #[prost(
        oneof = "attribute_proto::Value",
        tags = "3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32"
    )]
    pub value: Option<attribute_proto::Value>,
}

/// The value of an [`AttributeProto`].
pub mod attribute_proto {
    /// One of the schema's scalar or list types.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(double, tag = "3")]
        DoubleVal(f64),
        #[prost(message, tag = "4")]
        DoubleList(super::DoubleList),
        #[prost(float, tag = "5")]
        FloatVal(f32),
        #[prost(message, tag = "6")]
        FloatList(super::FloatList),
        #[prost(int32, tag = "7")]
        Int32Val(i32),
        #[prost(message, tag = "8")]
        Int32List(super::Int32List),
        #[prost(int64, tag = "9")]
        Int64Val(i64),
        #[prost(message, tag = "10")]
        Int64List(super::Int64List),
        #[prost(uint32, tag = "11")]
        Uint32Val(u32),
        #[prost(message, tag = "12")]
        Uint32List(super::Uint32List),
        #[prost(uint64, tag = "13")]
        Uint64Val(u64),
        #[prost(message, tag = "14")]
        Uint64List(super::Uint64List),
        #[prost(sint32, tag = "15")]
        Sint32Val(i32),
        #[prost(message, tag = "16")]
        Sint32List(super::Sint32List),
        #[prost(sint64, tag = "17")]
        Sint64Val(i64),
        #[prost(message, tag = "18")]
        Sint64List(super::Sint64List),
        #[prost(fixed32, tag = "19")]
        Fixed32Val(u32),
        #[prost(message, tag = "20")]
        Fixed32List(super::Fixed32List),
        #[prost(fixed64, tag = "21")]
        Fixed64Val(u64),
        #[prost(message, tag = "22")]
        Fixed64List(super::Fixed64List),
        #[prost(sfixed32, tag = "23")]
        Sfixed32Val(i32),
        #[prost(message, tag = "24")]
        Sfixed32List(super::Sfixed32List),
        #[prost(sfixed64, tag = "25")]
        Sfixed64Val(i64),
        #[prost(message, tag = "26")]
        Sfixed64List(super::Sfixed64List),
        #[prost(bool, tag = "27")]
        BoolVal(bool),
        #[prost(message, tag = "28")]
        BoolList(super::BoolList),
        #[prost(string, tag = "29")]
        StringVal(String),
        #[prost(message, tag = "30")]
        StringList(super::StringList),
        #[prost(bytes = "vec", tag = "31")]
        BytesVal(Vec<u8>),
        #[prost(message, tag = "32")]
        BytesList(super::BytesList),
    }
}

macro_rules! list {
    ($name:ident, $kind:ident, $ty:ty) => {
        /// A list value of an [`AttributeProto`].
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct $name {
            #[prost($kind, repeated, tag = "1")]
            pub values: Vec<$ty>,
        }
    };
}
list!(DoubleList, double, f64);
list!(FloatList, float, f32);
list!(Int32List, int32, i32);
list!(Int64List, int64, i64);
list!(Uint32List, uint32, u32);
list!(Uint64List, uint64, u64);
list!(Sint32List, sint32, i32);
list!(Sint64List, sint64, i64);
list!(Fixed32List, fixed32, u32);
list!(Fixed64List, fixed64, u64);
list!(Sfixed32List, sfixed32, i32);
list!(Sfixed64List, sfixed64, i64);
list!(BoolList, bool, bool);
list!(StringList, string, String);

/// A list of byte strings.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BytesList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub values: Vec<Vec<u8>>,
}

/// The first message of a `.et` file: the schema version and free attributes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GlobalMetadata {
    /// Chakra's schema version, e.g. "0.0.4".
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, repeated, tag = "2")]
    pub attr: Vec<AttributeProto>,
}

/// What a node is (Chakra's `NodeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NodeType {
    InvalidNode = 0,
    MetadataNode = 1,
    MemLoadNode = 2,
    MemStoreNode = 3,
    CompNode = 4,
    CommSendNode = 5,
    CommRecvNode = 6,
    CommCollNode = 7,
    StorageNode = 8,
    BatchNode = 9,
    CheckpointNode = 10,
}

/// The collective of a `COMM_COLL_NODE` (its `comm_type` attribute; Chakra's
/// `CollectiveCommType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CollectiveCommType {
    AllReduce = 0,
    Reduce = 1,
    AllGather = 2,
    Gather = 3,
    Scatter = 4,
    Broadcast = 5,
    AllToAll = 6,
    ReduceScatter = 7,
    ReduceScatterBlock = 8,
    Barrier = 9,
}

/// One node of the execution graph.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(enumeration = "NodeType", tag = "3")]
    pub r#type: i32,
    /// Nodes that must finish before this one starts (program order).
    #[prost(uint64, repeated, tag = "4")]
    pub ctrl_deps: Vec<u64>,
    /// Nodes whose outputs this one reads.
    #[prost(uint64, repeated, tag = "5")]
    pub data_deps: Vec<u64>,
    #[prost(uint64, tag = "6")]
    pub start_time_micros: u64,
    #[prost(uint64, tag = "7")]
    pub duration_micros: u64,
    #[prost(message, optional, tag = "8")]
    pub inputs: Option<IoInfo>,
    #[prost(message, optional, tag = "9")]
    pub outputs: Option<IoInfo>,
    #[prost(message, repeated, tag = "10")]
    pub attr: Vec<AttributeProto>,
}

/// A node's inputs or outputs, as the text PyTorch's execution trace wrote.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IoInfo {
    #[prost(string, tag = "1")]
    pub values: String,
    #[prost(string, tag = "2")]
    pub shapes: String,
    #[prost(string, tag = "3")]
    pub types: String,
}

/// Chakra's `Tensor` message (tensors inside `IOInfo` values).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tensor {
    #[prost(uint64, tag = "1")]
    pub tensor_id: u64,
    #[prost(uint64, tag = "2")]
    pub storage_id: u64,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(uint64, tag = "4")]
    pub num_elem: u64,
    #[prost(uint64, tag = "5")]
    pub elem_bytes: u64,
    #[prost(string, tag = "6")]
    pub device: String,
}

impl AttributeProto {
    /// An attribute named `name` holding `value`.
    pub fn new(name: &str, value: attribute_proto::Value) -> Self {
        AttributeProto { name: name.to_string(), doc_string: String::new(), value: Some(value) }
    }

    /// The value as an integer, if it is one of the integer (or bool) types.
    pub fn as_i128(&self) -> Option<i128> {
        use attribute_proto::Value as V;
        Some(match self.value.as_ref()? {
            V::Int32Val(v) | V::Sint32Val(v) | V::Sfixed32Val(v) => i128::from(*v),
            V::Int64Val(v) | V::Sint64Val(v) | V::Sfixed64Val(v) => i128::from(*v),
            V::Uint32Val(v) | V::Fixed32Val(v) => i128::from(*v),
            V::Uint64Val(v) | V::Fixed64Val(v) => i128::from(*v),
            V::BoolVal(v) => i128::from(*v),
            _ => return None,
        })
    }

    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        use attribute_proto::Value as V;
        match self.value.as_ref()? {
            V::DoubleVal(v) => Some(*v),
            V::FloatVal(v) => Some(f64::from(*v)),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The value as text, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self.value.as_ref()? {
            attribute_proto::Value::StringVal(v) => Some(v),
            _ => None,
        }
    }
}

impl Node {
    /// The attribute named `name`, if present.
    pub fn attribute(&self, name: &str) -> Option<&AttributeProto> {
        self.attr.iter().find(|a| a.name == name)
    }
}

/// A decoded `.et` file.
#[derive(Debug, Clone, PartialEq)]
pub struct EtFile {
    /// Its metadata message.
    pub metadata: GlobalMetadata,
    /// Its nodes, in file order.
    pub nodes: Vec<Node>,
}

/// Decodes the length-delimited messages of a `.et` file's bytes; `Err` says at which message
/// and byte the framing or a message broke.
pub fn decode(bytes: &[u8]) -> Result<EtFile, String> {
    let mut rest = bytes;
    let at = |rest: &[u8]| bytes.len() - rest.len();
    let metadata = GlobalMetadata::decode_length_delimited(&mut rest)
        .map_err(|e| format!("the GlobalMetadata message at byte 0: {e}"))?;
    let mut nodes = Vec::new();
    while !rest.is_empty() {
        let offset = at(rest);
        let node = Node::decode_length_delimited(&mut rest)
            .map_err(|e| format!("node message {} at byte {offset}: {e}", nodes.len()))?;
        nodes.push(node);
    }
    Ok(EtFile { metadata, nodes })
}

/// Encodes `file` as a `.et` file's bytes.
pub fn encode(file: &EtFile) -> Vec<u8> {
    let mut out = Vec::new();
    // Encoding into a Vec cannot run out of room.
    let _ = file.metadata.encode_length_delimited(&mut out);
    for node in &file.nodes {
        let _ = node.encode_length_delimited(&mut out);
    }
    out
}

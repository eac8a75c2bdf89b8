//! A client that knows nothing of colibri's generated code talks to `colibrid`, the way
//! grpcurl does: it asks the daemon's server reflection for the service description, builds
//! requests from JSON with generic protobuf messages (prost-reflect), and decodes the
//! answers the same way. Covers the health service, reflection v1 and v1alpha, Status and a
//! streamed Generate. (tools/grpc_smoke.py does the same with Python grpcio, outside CI.)

use colibri_tests::daemon::Daemon;
use colibri_tests::{fixture, Reference};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use serde_json::{json, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Status;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

/// Encodes and decodes messages known only by their runtime descriptor.
struct DynamicCodec {
    response: MessageDescriptor,
}

struct DynamicEncoder;
struct DynamicDecoder(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;
    fn encoder(&mut self) -> DynamicEncoder {
        DynamicEncoder
    }
    fn decoder(&mut self) -> DynamicDecoder {
        DynamicDecoder(self.response.clone())
    }
}

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;
    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// Every service the daemon lists, and the descriptors of the file that defines `symbol`.
async fn reflect(channel: Channel, symbol: &str) -> (Vec<String>, DescriptorPool) {
    let mut client = ServerReflectionClient::new(channel);
    let ask = |r: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(r),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(symbol.into())),
    ];
    let mut answers = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut services = Vec::new();
    let mut pool = DescriptorPool::new();
    while let Some(a) = answers.message().await.unwrap() {
        match a.message_response.expect("an answer") {
            MessageResponse::ListServicesResponse(l) => {
                services.extend(l.service.into_iter().map(|s| s.name))
            }
            MessageResponse::FileDescriptorResponse(f) => {
                for bytes in f.file_descriptor_proto {
                    pool.decode_file_descriptor_proto(bytes.as_slice()).unwrap();
                }
            }
            other => panic!("unexpected reflection answer {other:?}"),
        }
    }
    (services, pool)
}

/// Calls `service/method` with a JSON request; returns every response message as JSON.
async fn call(
    channel: Channel,
    pool: &DescriptorPool,
    service: &str,
    method: &str,
    request: Value,
) -> Result<Vec<Value>, Status> {
    let svc = pool
        .get_service_by_name(service)
        .expect("service described");
    let m = svc
        .methods()
        .find(|m| m.name() == method)
        .expect("method described");
    let req =
        DynamicMessage::deserialize(m.input(), request).expect("request matches its descriptor");
    let path: tonic::codegen::http::uri::PathAndQuery =
        format!("/{service}/{method}").parse().unwrap();
    let codec = DynamicCodec {
        response: m.output(),
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let to_json = |msg: DynamicMessage| serde_json::to_value(&msg).unwrap();
    if m.is_server_streaming() {
        let mut s = grpc
            .server_streaming(tonic::Request::new(req), path, codec)
            .await?
            .into_inner();
        let mut out = Vec::new();
        while let Some(msg) = s.message().await? {
            out.push(to_json(msg));
        }
        Ok(out)
    } else {
        let msg = grpc
            .unary(tonic::Request::new(req), path, codec)
            .await?
            .into_inner();
        Ok(vec![to_json(msg)])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflection_driven_generic_client_calls_status_and_a_streamed_generate() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("c.sock"), &dir.path().join("state"), &[]);
    let channel = colibri_proto::connect::channel(&d.socket).await.unwrap();

    let (services, pool) = reflect(channel.clone(), "colibri.v1.Colibri").await;
    for s in ["colibri.v1.Colibri", "grpc.health.v1.Health"] {
        assert!(
            services.iter().any(|x| x == s),
            "{s} not listed: {services:?}"
        );
    }
    // The older reflection protocol (still used by some tools) answers too.
    let mut alpha =
        tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient::new(
            channel.clone(),
        );
    let req = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut a = alpha
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    assert!(a.message().await.unwrap().is_some());

    // Health, described by reflection too.
    let (_, health_pool) = reflect(channel.clone(), "grpc.health.v1.Health").await;
    let h = call(
        channel.clone(),
        &health_pool,
        "grpc.health.v1.Health",
        "Check",
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(h[0]["status"], "SERVING");

    let svc = "colibri.v1.Colibri";
    let status = call(channel.clone(), &pool, svc, "Status", json!({}))
        .await
        .unwrap();
    assert_eq!(status[0]["version"], env!("CARGO_PKG_VERSION"));

    let model = fixture("olmoe");
    let progress = call(
        channel.clone(),
        &pool,
        svc,
        "LoadModel",
        json!({ "model": model }),
    )
    .await
    .unwrap();
    let ready = progress.last().unwrap();
    assert_eq!(ready["stage"], "STAGE_READY");
    let id = ready["info"]["id"].as_str().unwrap().to_string();

    let r = Reference::load("olmoe");
    let request = json!({
        "model": id,
        "prompt_ids": r.prompt_ids,
        "options": { "max_tokens": 8, "ignore_eos": true, "sampling": { "temperature": 0.0 } },
    });
    let events = call(channel.clone(), &pool, svc, "Generate", request)
        .await
        .unwrap();
    assert!(events[0].get("started").is_some(), "{events:?}");
    let ids: Vec<u64> = events
        .iter()
        .filter_map(|e| e.get("tokens"))
        .flat_map(|t| {
            t["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
        })
        .collect();
    let want: Vec<u64> = r.greedy_ids[..8].iter().map(|&x| x as u64).collect();
    assert_eq!(ids, want);
    let finished = &events.last().unwrap()["finished"];
    assert_eq!(finished["reason"], "FINISH_REASON_LENGTH");
    assert_eq!(finished["stats"]["generatedTokens"], 8);

    // A bad request is refused with INVALID_ARGUMENT naming the field, as for any client.
    let bad = json!({ "model": id, "prompt_ids": [1_000_000], "options": { "max_tokens": 1 } });
    let e = call(channel, &pool, svc, "Generate", bad)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("prompt"), "{}", e.message());
}

//! The production [`Generator`]: the coordinator's `Generate` stream over gRPC (`easd.v1`).
//!
//! Generated protobuf types stay in this file; the rest of the crate speaks its own types.

use std::time::Duration;

use easd_proto::v1 as pb;
use easd_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{BoxError, Error, Result};
use crate::generator::{EasdOrder, EasdSettings, EvalRequest, Generation, GenerationSummary, Generator, Mode, Trigger};

/// Talks to one coordinator. Cheap to share: requests run concurrently over one HTTP/2 channel.
#[derive(Clone, Debug)]
pub struct CoordinatorGenerator {
    client: CoordinatorClient<Channel>,
    request_timeout: Duration,
}

/// What the coordinator says about itself (for the report's setup lines).
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorDescription {
    pub draft_model: Option<String>,
    pub target_models: Vec<String>,
    /// The coordinator's default EASD parameters (its calibration file, when it loaded one).
    pub default_easd: EasdSettings,
}

impl CoordinatorGenerator {
    /// Connects to `endpoint` (e.g. `http://127.0.0.1:50051`). `request_timeout` bounds one whole generation
    /// (sent as the gRPC deadline): long enough for `max_tokens` at the slowest mode.
    pub async fn connect(endpoint: &str, request_timeout: Duration) -> Result<CoordinatorGenerator> {
        let invalid = |reason: String| Error::invalid("endpoint", format!("{endpoint}: {reason}"));
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| invalid(format!("cannot connect: {e}")))?;
        Ok(CoordinatorGenerator::new(channel, request_timeout))
    }

    pub fn new(channel: Channel, request_timeout: Duration) -> CoordinatorGenerator {
        CoordinatorGenerator { client: CoordinatorClient::new(channel), request_timeout }
    }

    /// The coordinator's `Info`.
    pub async fn describe(&self) -> Result<CoordinatorDescription, BoxError> {
        let info = self.client.clone().info(pb::InfoRequest {}).await?.into_inner();
        Ok(CoordinatorDescription {
            draft_model: info.draft.map(|m| m.name),
            target_models: info.verifiers.into_iter().map(|m| m.name).collect(),
            default_easd: info.default_easd.map(easd_from_proto).unwrap_or_default(),
        })
    }
}

impl Generator for CoordinatorGenerator {
    async fn generate(&self, request: &EvalRequest) -> Result<Generation, BoxError> {
        let mut grpc_request = tonic::Request::new(request_to_proto(request));
        grpc_request.set_timeout(self.request_timeout);
        let mut stream = self.client.clone().generate(grpc_request).await?.into_inner();
        let mut text = String::new();
        let mut token_ids = Vec::new();
        let mut summary = None;
        while let Some(event) = stream.message().await? {
            match event.event {
                Some(pb::generate_event::Event::Delta(delta)) => {
                    text.push_str(&delta.text);
                    token_ids.extend(delta.token_ids);
                }
                Some(pb::generate_event::Event::Summary(s)) => summary = Some(summary_from_proto(s)),
                None => {}
            }
        }
        let summary = summary.ok_or("the coordinator's stream ended without a Summary")?;
        Ok(Generation { text, token_ids, summary })
    }
}

fn mode_to_proto(mode: Mode) -> pb::Mode {
    match mode {
        Mode::Draft => pb::Mode::Draft,
        Mode::Target => pb::Mode::Target,
        Mode::Sd => pb::Mode::Sd,
        Mode::Easd => pb::Mode::Easd,
    }
}

fn request_to_proto(request: &EvalRequest) -> pb::GenerateRequest {
    let messages =
        request.messages.iter().map(|m| pb::ChatMessage { role: m.role.clone(), content: m.content.clone() }).collect();
    let easd = (request.mode == Mode::Easd).then_some(pb::EasdParams {
        top_n: request.easd.top_n,
        rho: request.easd.rho,
        tau_draft: request.easd.tau_draft,
        tau_target: request.easd.tau_target,
        order: match request.easd.order {
            None => pb::EasdOrder::Unspecified,
            Some(EasdOrder::AfterSd) => pb::EasdOrder::AfterSd,
            Some(EasdOrder::Gate) => pb::EasdOrder::Gate,
        } as i32,
        penalty_alpha: request.easd.penalty_alpha,
    });
    let s = &request.sampling;
    pb::GenerateRequest {
        input: Some(pb::generate_request::Input::Chat(pb::ChatMessages { messages })),
        max_tokens: Some(request.max_tokens),
        temperature: Some(s.temperature),
        top_p: Some(s.top_p),
        top_k: Some(s.top_k),
        seed: Some(s.seed),
        mode: mode_to_proto(request.mode) as i32,
        k: Some(request.k),
        easd,
        stop: Vec::new(),
        logprobs: 0,
        request_id: request.request_id.clone(),
        // The coordinator's default: drafting ahead changes the timing, never the tokens.
        pipeline: None,
    }
}

fn easd_from_proto(p: pb::EasdParams) -> EasdSettings {
    EasdSettings {
        top_n: p.top_n,
        rho: p.rho,
        tau_draft: p.tau_draft,
        tau_target: p.tau_target,
        order: match pb::EasdOrder::try_from(p.order) {
            Ok(pb::EasdOrder::AfterSd) => Some(EasdOrder::AfterSd),
            Ok(pb::EasdOrder::Gate) => Some(EasdOrder::Gate),
            Ok(pb::EasdOrder::Unspecified) | Err(_) => None,
        },
        penalty_alpha: p.penalty_alpha,
    }
}

fn summary_from_proto(s: pb::Summary) -> GenerationSummary {
    GenerationSummary {
        prompt_tokens: s.prompt_tokens,
        generated_tokens: s.generated_tokens,
        wall_s: s.wall_s,
        tokens_per_s: s.tokens_per_s,
        blocks: s.blocks,
        drafted_tokens: s.drafted_tokens,
        accepted_tokens: s.accepted_tokens,
        acceptance_rate: s.acceptance_rate,
        mean_accepted_len: s.mean_accepted_len,
        easd_triggers: s.easd_triggers,
        target_forwards: s.target_forwards,
        discarded_tokens: s.discarded_tokens,
        failovers: s.failovers,
        finish_reason: s.finish_reason,
        time_to_first_token_s: s.time_to_first_token_s,
        draft_forward_s: s.draft_forward_seconds,
        target_forward_s: s.target_forward_seconds,
        overhead_s: s.overhead_seconds,
        triggers: s
            .triggers
            .into_iter()
            .map(|t| Trigger {
                position: t.position,
                draft_entropy: t.draft_entropy,
                target_entropy: t.target_entropy,
                overlap: t.overlap,
            })
            .collect(),
        note: s.note,
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Mutex;

    use futures::Stream;
    use pb::coordinator_server::{Coordinator, CoordinatorServer};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;
    use crate::generator::{ChatMessage, Sampling};

    /// Streams "The answer is " + "42." in two deltas, then a Summary with one trigger; remembers the request.
    #[derive(Default)]
    struct FakeCoordinator {
        seen: std::sync::Arc<Mutex<Vec<pb::GenerateRequest>>>,
    }

    type EventStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, tonic::Status>> + Send>>;

    #[tonic::async_trait]
    impl Coordinator for FakeCoordinator {
        type GenerateStream = EventStream;

        async fn info(
            &self,
            _: tonic::Request<pb::InfoRequest>,
        ) -> Result<tonic::Response<pb::CoordinatorInfo>, tonic::Status> {
            Ok(tonic::Response::new(pb::CoordinatorInfo {
                draft: Some(pb::ModelInfo { name: "small".into(), ..Default::default() }),
                verifiers: vec![pb::ModelInfo { name: "large".into(), ..Default::default() }],
                default_easd: Some(pb::EasdParams {
                    tau_draft: Some(0.81),
                    order: pb::EasdOrder::Gate as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }))
        }

        async fn generate(
            &self,
            request: tonic::Request<pb::GenerateRequest>,
        ) -> Result<tonic::Response<EventStream>, tonic::Status> {
            let request = request.into_inner();
            let fail = request.request_id == "no-summary";
            self.seen.lock().unwrap().push(request);
            let delta = |t: &str, ids: &[u32]| pb::GenerateEvent {
                event: Some(pb::generate_event::Event::Delta(pb::TextDelta {
                    text: t.into(),
                    token_ids: ids.to_vec(),
                    ..Default::default()
                })),
            };
            let mut events = vec![Ok(delta("The answer is ", &[785, 4226, 374])), Ok(delta("42.", &[19, 17, 13]))];
            if !fail {
                let summary = pb::Summary {
                    generated_tokens: 6,
                    accepted_tokens: 4,
                    easd_triggers: 1,
                    finish_reason: "stop".into(),
                    triggers: vec![pb::EasdTrigger {
                        position: 30,
                        draft_entropy: 1.5,
                        target_entropy: 1.2,
                        overlap: 0.8,
                    }],
                    ..Default::default()
                };
                events.push(Ok(pb::GenerateEvent { event: Some(pb::generate_event::Event::Summary(summary)) }));
            }
            Ok(tonic::Response::new(Box::pin(futures::stream::iter(events))))
        }
    }

    fn request(mode: Mode) -> EvalRequest {
        EvalRequest {
            messages: vec![ChatMessage { role: "user".into(), content: "What is 40 + 2?".into() }],
            mode,
            sampling: Sampling { seed: 9, ..Sampling::default() },
            k: 4,
            easd: EasdSettings { rho: Some(0.7), order: Some(EasdOrder::AfterSd), ..EasdSettings::default() },
            max_tokens: 1024,
            request_id: "r1".into(),
        }
    }

    #[tokio::test]
    async fn a_generation_round_trips_through_a_grpc_coordinator() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = FakeCoordinator::default();
        let seen = fake.seen.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CoordinatorServer::new(fake))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        let generator =
            CoordinatorGenerator::connect(&format!("http://{addr}"), Duration::from_secs(30)).await.unwrap();

        let generation = generator.generate(&request(Mode::Easd)).await.unwrap();
        assert_eq!(generation.text, "The answer is 42.");
        assert_eq!(generation.token_ids, [785, 4226, 374, 19, 17, 13]);
        assert_eq!((generation.summary.generated_tokens, generation.summary.easd_triggers), (6, 1));
        assert_eq!(generation.summary.triggers[0].position, 30);
        assert_eq!(generation.summary.token_sources(Mode::Easd), (4, 2));
        let sent = seen.lock().unwrap()[0].clone();
        assert_eq!(
            (sent.mode, sent.seed, sent.k, sent.max_tokens),
            (pb::Mode::Easd as i32, Some(9), Some(4), Some(1024))
        );
        let easd = sent.easd.unwrap();
        assert_eq!((easd.rho, easd.order, easd.tau_draft), (Some(0.7), pb::EasdOrder::AfterSd as i32, None));

        generator.generate(&request(Mode::Sd)).await.unwrap();
        assert_eq!(seen.lock().unwrap()[1].easd, None, "EASD parameters go only with easd mode");

        let mut bad = request(Mode::Sd);
        bad.request_id = "no-summary".into();
        let err = generator.generate(&bad).await.unwrap_err().to_string();
        assert!(err.contains("without a Summary"), "{err}");

        let info = generator.describe().await.unwrap();
        assert_eq!((info.draft_model.as_deref(), info.target_models.len()), (Some("small"), 1));
        assert_eq!((info.default_easd.tau_draft, info.default_easd.order), (Some(0.81), Some(EasdOrder::Gate)));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_clear_error() {
        let err = CoordinatorGenerator::connect("not a url", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("endpoint"), "{err}");
    }
}
